# Draws the grid plots; run from the results folder: gnuplot plotdata/plots.gp
set datafile missing "?"
set encoding utf8
set grid ytics lc rgb "#dddddd"
set key below horizontal maxcols 3 font ",10"
set bars small
# accuracy vs bit width
set terminal pngcairo noenhanced size 1420,540 font "sans,11"
set output "accuracy_vs_bits.png"
set multiplot layout 1,3 title "Test accuracy vs bit width (Q/DQ graph, mean ± std over 1 seed)"
set xrange [-0.5:2.500000]
set ylabel "test accuracy (%)"
set xlabel "bit width (W: weights, A: activations)"
set title "fashion_cnn_onnx"
plot "plotdata/acc_fashion_cnn_onnx.dat" u 1:3:xtic(2) w lines dt 2 lw 2 lc rgb "#555555" t "fp32", \
     "plotdata/acc_fashion_cnn_onnx.dat" u ($1-0.070):5:6 w yerrorlines pt 7 lw 2 lc rgb "#d62728" t "PTQ", \
     "plotdata/acc_fashion_cnn_onnx.dat" u ($1-0.070):7 w points pt 6 ps 1.6 lc rgb "#d62728" t "PTQ int8 device", \
     "plotdata/acc_fashion_cnn_onnx.dat" u ($1+0.000):8:9 w yerrorlines pt 7 lw 2 lc rgb "#ff7f0e" t "PTQ-MSE", \
     "plotdata/acc_fashion_cnn_onnx.dat" u ($1+0.000):10 w points pt 6 ps 1.6 lc rgb "#ff7f0e" t "PTQ-MSE int8 device", \
     "plotdata/acc_fashion_cnn_onnx.dat" u ($1+0.070):11:12 w yerrorlines pt 5 lw 2 lc rgb "#1f77b4" t "QAT", \
     "plotdata/acc_fashion_cnn_onnx.dat" u ($1+0.070):13 w points pt 4 ps 1.6 lc rgb "#1f77b4" t "QAT int8 device"
set title "fashion_mlp_onnx"
plot "plotdata/acc_fashion_mlp_onnx.dat" u 1:3:xtic(2) w lines dt 2 lw 2 lc rgb "#555555" t "fp32", \
     "plotdata/acc_fashion_mlp_onnx.dat" u ($1-0.070):5:6 w yerrorlines pt 7 lw 2 lc rgb "#d62728" t "PTQ", \
     "plotdata/acc_fashion_mlp_onnx.dat" u ($1-0.070):7 w points pt 6 ps 1.6 lc rgb "#d62728" t "PTQ int8 device", \
     "plotdata/acc_fashion_mlp_onnx.dat" u ($1+0.000):8:9 w yerrorlines pt 7 lw 2 lc rgb "#ff7f0e" t "PTQ-MSE", \
     "plotdata/acc_fashion_mlp_onnx.dat" u ($1+0.000):10 w points pt 6 ps 1.6 lc rgb "#ff7f0e" t "PTQ-MSE int8 device", \
     "plotdata/acc_fashion_mlp_onnx.dat" u ($1+0.070):11:12 w yerrorlines pt 5 lw 2 lc rgb "#1f77b4" t "QAT", \
     "plotdata/acc_fashion_mlp_onnx.dat" u ($1+0.070):13 w points pt 4 ps 1.6 lc rgb "#1f77b4" t "QAT int8 device"
set title "res_cnn_onnx"
plot "plotdata/acc_res_cnn_onnx.dat" u 1:3:xtic(2) w lines dt 2 lw 2 lc rgb "#555555" t "fp32", \
     "plotdata/acc_res_cnn_onnx.dat" u ($1-0.070):5:6 w yerrorlines pt 7 lw 2 lc rgb "#d62728" t "PTQ", \
     "plotdata/acc_res_cnn_onnx.dat" u ($1-0.070):7 w points pt 6 ps 1.6 lc rgb "#d62728" t "PTQ int8 device", \
     "plotdata/acc_res_cnn_onnx.dat" u ($1+0.000):8:9 w yerrorlines pt 7 lw 2 lc rgb "#ff7f0e" t "PTQ-MSE", \
     "plotdata/acc_res_cnn_onnx.dat" u ($1+0.000):10 w points pt 6 ps 1.6 lc rgb "#ff7f0e" t "PTQ-MSE int8 device", \
     "plotdata/acc_res_cnn_onnx.dat" u ($1+0.070):11:12 w yerrorlines pt 5 lw 2 lc rgb "#1f77b4" t "QAT", \
     "plotdata/acc_res_cnn_onnx.dat" u ($1+0.070):13 w points pt 4 ps 1.6 lc rgb "#1f77b4" t "QAT int8 device"
unset multiplot
unset xrange
unset xlabel
set terminal pngcairo noenhanced size 1000,540 font "sans,11"
set output "ptq_vs_qat.png"
set title "QAT minus PTQ, Q/DQ-graph test accuracy (points, mean ± std over seeds)"
set style data histograms
set style histogram errorbars gap 2 lw 1
set boxwidth 0.9
set key inside top left
set yrange [*:*]
set xzeroaxis lt -1
set ylabel "QAT − PTQ (points)"
plot "plotdata/gain.dat" u 2:3:xtic(1) t "fashion_cnn_onnx vs PTQ" lc rgb "#1f77b4" fs solid 0.8 border -1, \
     "plotdata/gain.dat" u 4:5 t "fashion_cnn_onnx vs PTQ-MSE" lc rgb "#1f77b4" fs pattern 2 border -1, \
     "plotdata/gain.dat" u 6:7 t "fashion_mlp_onnx vs PTQ" lc rgb "#ff7f0e" fs solid 0.8 border -1, \
     "plotdata/gain.dat" u 8:9 t "fashion_mlp_onnx vs PTQ-MSE" lc rgb "#ff7f0e" fs pattern 2 border -1, \
     "plotdata/gain.dat" u 10:11 t "res_cnn_onnx vs PTQ" lc rgb "#2ca02c" fs solid 0.8 border -1, \
     "plotdata/gain.dat" u 12:13 t "res_cnn_onnx vs PTQ-MSE" lc rgb "#2ca02c" fs pattern 2 border -1
set style data lines
set style fill empty
unset xzeroaxis
set terminal pngcairo noenhanced size 1420,820 font "sans,11"
set output "qat_curves.png"
set multiplot layout 2,3 title "Training curves: fp32 epochs, then QAT (mean ± std over seeds)"
set key inside bottom right font ",9"
set xlabel "epoch"
set xtics 1
set title "fashion_cnn_onnx"
set ylabel "test accuracy (%)"
set arrow 1 from 4.500000, graph 0 to 4.500000, graph 1 nohead dt 3 lc rgb "#888888"
plot "plotdata/curves_fashion_cnn_onnx.dat" index 0 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 2 lc rgb "#000000" t "fp32", \
     "plotdata/curves_fashion_cnn_onnx.dat" index 1 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#1f77b4" t "QAT W8A8", \
     "plotdata/curves_fashion_cnn_onnx.dat" index 2 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#ff7f0e" t "QAT W4A8", \
     "plotdata/curves_fashion_cnn_onnx.dat" index 3 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#2ca02c" t "QAT W4A4"
set title "fashion_mlp_onnx"
set ylabel "test accuracy (%)"
set arrow 1 from 4.500000, graph 0 to 4.500000, graph 1 nohead dt 3 lc rgb "#888888"
plot "plotdata/curves_fashion_mlp_onnx.dat" index 0 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 2 lc rgb "#000000" t "fp32", \
     "plotdata/curves_fashion_mlp_onnx.dat" index 1 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#1f77b4" t "QAT W8A8", \
     "plotdata/curves_fashion_mlp_onnx.dat" index 2 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#ff7f0e" t "QAT W4A8", \
     "plotdata/curves_fashion_mlp_onnx.dat" index 3 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#2ca02c" t "QAT W4A4"
set title "res_cnn_onnx"
set ylabel "test accuracy (%)"
set arrow 1 from 4.500000, graph 0 to 4.500000, graph 1 nohead dt 3 lc rgb "#888888"
plot "plotdata/curves_res_cnn_onnx.dat" index 0 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 2 lc rgb "#000000" t "fp32", \
     "plotdata/curves_res_cnn_onnx.dat" index 1 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#1f77b4" t "QAT W8A8", \
     "plotdata/curves_res_cnn_onnx.dat" index 2 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#ff7f0e" t "QAT W4A8", \
     "plotdata/curves_res_cnn_onnx.dat" index 3 u 1:2:3 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#2ca02c" t "QAT W4A4"
set title "fashion_cnn_onnx"
set ylabel "training loss"
set arrow 1 from 4.500000, graph 0 to 4.500000, graph 1 nohead dt 3 lc rgb "#888888"
set logscale y
plot "plotdata/curves_fashion_cnn_onnx.dat" index 0 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 2 lc rgb "#000000" t "fp32", \
     "plotdata/curves_fashion_cnn_onnx.dat" index 1 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#1f77b4" t "QAT W8A8", \
     "plotdata/curves_fashion_cnn_onnx.dat" index 2 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#ff7f0e" t "QAT W4A8", \
     "plotdata/curves_fashion_cnn_onnx.dat" index 3 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#2ca02c" t "QAT W4A4"
unset logscale y
set title "fashion_mlp_onnx"
set ylabel "training loss"
set arrow 1 from 4.500000, graph 0 to 4.500000, graph 1 nohead dt 3 lc rgb "#888888"
set logscale y
plot "plotdata/curves_fashion_mlp_onnx.dat" index 0 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 2 lc rgb "#000000" t "fp32", \
     "plotdata/curves_fashion_mlp_onnx.dat" index 1 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#1f77b4" t "QAT W8A8", \
     "plotdata/curves_fashion_mlp_onnx.dat" index 2 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#ff7f0e" t "QAT W4A8", \
     "plotdata/curves_fashion_mlp_onnx.dat" index 3 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#2ca02c" t "QAT W4A4"
unset logscale y
set title "res_cnn_onnx"
set ylabel "training loss"
set arrow 1 from 4.500000, graph 0 to 4.500000, graph 1 nohead dt 3 lc rgb "#888888"
set logscale y
plot "plotdata/curves_res_cnn_onnx.dat" index 0 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 2 lc rgb "#000000" t "fp32", \
     "plotdata/curves_res_cnn_onnx.dat" index 1 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#1f77b4" t "QAT W8A8", \
     "plotdata/curves_res_cnn_onnx.dat" index 2 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#ff7f0e" t "QAT W4A8", \
     "plotdata/curves_res_cnn_onnx.dat" index 3 u 1:4:5 w yerrorlines pt 7 ps 0.8 lw 1 lc rgb "#2ca02c" t "QAT W4A4"
unset logscale y
unset multiplot
unset arrow 1
set output
