# usage: cpu.sh ctlpid suppid wrkpid seconds -> CPU ticks (utime+stime) of each over the window
T=$4; CLK=$(getconf CLK_TCK)
r() { for p in $1 $2 $3; do awk '{print $14+$15}' /proc/$p/stat; done | tr '\n' ' '; }
a=$(r $1 $2 $3); sleep $T; b=$(r $1 $2 $3)
echo "$a | $b | CLK $CLK"
