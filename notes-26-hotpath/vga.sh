#!/bin/bash
# vga.sh DIR OUT N [code]: supervisor and worker instructions/cell for checkout DIR (host agent)
rm -rf $2; WT=$1 timeout 900 python /work/wt-hot/notes-26-hotpath/vg_agent.py $2 $3 "${4:-1}" >/dev/null 2>&1
python /work/wt-hot/notes-26-hotpath/vg_sum.py $2 $3 | sed "s|^|$(basename $1) |"
