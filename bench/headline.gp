# SPDX-License-Identifier: BSD-2-Clause
# The chart of README.md's headline table: five results of sluice, nginx and
# HAProxy, each from the latest run in bench/RESULTS.md (the figures below are
# copied from there; change both together). Run from the repository's root:
#   gnuplot bench/headline.gp        # writes bench/headline.png
set terminal pngcairo size 1600,440 font "sans,10"
set output "bench/headline.png"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.6
set xrange [-0.6:2.6]
set grid ytics
set xtics scale 0
set key off
unset xlabel
set yrange [0:*]
set multiplot layout 1,5 title "sluice, nginx and HAProxy on the same 2-core machine (bench/RESULTS.md)"

$bp << END
sluice 74
nginx 86
HAProxy 6720
END
set title "Slow clients, 4,000 streams,\nrefused ones retrying: fast p99 (ms, log)\nlower is better"
set logscale y
set yrange [10:20000]
plot $bp using 2:xtic(1) linecolor rgb "#1f77b4"
unset logscale y
set yrange [0:*]

$tp << END
sluice 11155
nginx 12974
HAProxy 11575
END
set title "Throughput, 4,096 connections:\nrequests/s\nhigher is better"
plot $tp using 2:xtic(1) linecolor rgb "#2ca02c"

$mem << END
sluice 17.7
nginx 17.7
HAProxy 4.6
END
set title "Memory per open stream,\n8,000 slow streams (KiB)\nlower is better"
plot $mem using 2:xtic(1) linecolor rgb "#9467bd"

$rt << END
sluice 355
nginx 808
HAProxy 841
END
set title "Multi-turn chat, 4 replicas:\np99 time to first token (ms)\nlower is better"
plot $rt using 2:xtic(1) linecolor rgb "#ff7f0e"

$fair << END
sluice 30.5
nginx 11.4
HAProxy 6.1
END
set title "One tenant floods the pool:\nsmall tenant B's token share (%)\nfair is 33.3"
set yrange [0:40]
plot $fair using 2:xtic(1) linecolor rgb "#d62728", 33.3 with lines dashtype 2 linecolor rgb "black"
unset multiplot
