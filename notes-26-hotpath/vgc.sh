#!/bin/bash
# vgc.sh DIR OUT N : controller instructions/cell for checkout DIR
cd $1 && export PYTHONPATH=$PWD && eval "$(scripts/ensure-image 2>/dev/null)"; rm -rf $2; mkdir -p $2
timeout 900 valgrind --tool=callgrind --callgrind-out-file=$2/cg.%p -q /root/.pyenv/versions/3.11.7/bin/python /work/wt-hot/notes-26-hotpath/vg_ctl.py $3 >/dev/null 2>&1
echo "$(basename $1) controller $(( $(grep -h '^summary' $2/*.1 | awk '{print $2}') / $3 )) instructions/cell"
