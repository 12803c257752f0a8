# Draws the grid plots; run from the results folder: gnuplot plotdata/plots.gp
set datafile missing "?"
set encoding utf8
set grid ytics lc rgb "#dddddd"
set key below horizontal maxcols 3 font ",10"
set bars small
# accuracy vs bit width
set terminal pngcairo noenhanced size 1880,540 font "sans,11"
set output "accuracy_vs_bits.png"
set multiplot layout 1,4 title "Test accuracy vs bit width (Q/DQ graph, mean ± std over 3 seeds)"
set xrange [-0.5:4.500000]
set ylabel "test accuracy (%)"
set xlabel "bit width (W: weights, A: activations)"
set title "fashion_cnn"
plot "plotdata/acc_fashion_cnn.dat" u 1:3:xtic(2) w lines dt 2 lw 2 lc rgb "#555555" t "fp32", \
     "plotdata/acc_fashion_cnn.dat" u ($1-0.070):5:6 w yerrorlines pt 7 lw 2 lc rgb "#d62728" t "PTQ-MSE", \
     "plotdata/acc_fashion_cnn.dat" u ($1-0.070):7 w points pt 6 ps 1.6 lc rgb "#d62728" t "PTQ-MSE int8 device", \
     "plotdata/acc_fashion_cnn.dat" u ($1-0.023):8:9 w yerrorlines pt 7 lw 2 lc rgb "#ff7f0e" t "PTQ-MSE+CLE+BC", \
     "plotdata/acc_fashion_cnn.dat" u ($1-0.023):10 w points pt 6 ps 1.6 lc rgb "#ff7f0e" t "PTQ-MSE+CLE+BC int8 device", \
     "plotdata/acc_fashion_cnn.dat" u ($1+0.023):11:12 w yerrorlines pt 7 lw 2 lc rgb "#1f77b4" t "AdaRound", \
     "plotdata/acc_fashion_cnn.dat" u ($1+0.023):13 w points pt 6 ps 1.6 lc rgb "#1f77b4" t "AdaRound int8 device", \
     "plotdata/acc_fashion_cnn.dat" u ($1+0.070):14:15 w yerrorlines pt 7 lw 2 lc rgb "#2ca02c" t "BRECQ+QDrop", \
     "plotdata/acc_fashion_cnn.dat" u ($1+0.070):16 w points pt 6 ps 1.6 lc rgb "#2ca02c" t "BRECQ+QDrop int8 device"
set title "fashion_mlp"
plot "plotdata/acc_fashion_mlp.dat" u 1:3:xtic(2) w lines dt 2 lw 2 lc rgb "#555555" t "fp32", \
     "plotdata/acc_fashion_mlp.dat" u ($1-0.070):5:6 w yerrorlines pt 7 lw 2 lc rgb "#d62728" t "PTQ-MSE", \
     "plotdata/acc_fashion_mlp.dat" u ($1-0.070):7 w points pt 6 ps 1.6 lc rgb "#d62728" t "PTQ-MSE int8 device", \
     "plotdata/acc_fashion_mlp.dat" u ($1-0.023):8:9 w yerrorlines pt 7 lw 2 lc rgb "#ff7f0e" t "PTQ-MSE+CLE+BC", \
     "plotdata/acc_fashion_mlp.dat" u ($1-0.023):10 w points pt 6 ps 1.6 lc rgb "#ff7f0e" t "PTQ-MSE+CLE+BC int8 device", \
     "plotdata/acc_fashion_mlp.dat" u ($1+0.023):11:12 w yerrorlines pt 7 lw 2 lc rgb "#1f77b4" t "AdaRound", \
     "plotdata/acc_fashion_mlp.dat" u ($1+0.023):13 w points pt 6 ps 1.6 lc rgb "#1f77b4" t "AdaRound int8 device", \
     "plotdata/acc_fashion_mlp.dat" u ($1+0.070):14:15 w yerrorlines pt 7 lw 2 lc rgb "#2ca02c" t "BRECQ+QDrop", \
     "plotdata/acc_fashion_mlp.dat" u ($1+0.070):16 w points pt 6 ps 1.6 lc rgb "#2ca02c" t "BRECQ+QDrop int8 device"
set title "res_cnn"
plot "plotdata/acc_res_cnn.dat" u 1:3:xtic(2) w lines dt 2 lw 2 lc rgb "#555555" t "fp32", \
     "plotdata/acc_res_cnn.dat" u ($1-0.070):5:6 w yerrorlines pt 7 lw 2 lc rgb "#d62728" t "PTQ-MSE", \
     "plotdata/acc_res_cnn.dat" u ($1-0.070):7 w points pt 6 ps 1.6 lc rgb "#d62728" t "PTQ-MSE int8 device", \
     "plotdata/acc_res_cnn.dat" u ($1-0.023):8:9 w yerrorlines pt 7 lw 2 lc rgb "#ff7f0e" t "PTQ-MSE+CLE+BC", \
     "plotdata/acc_res_cnn.dat" u ($1-0.023):10 w points pt 6 ps 1.6 lc rgb "#ff7f0e" t "PTQ-MSE+CLE+BC int8 device", \
     "plotdata/acc_res_cnn.dat" u ($1+0.023):11:12 w yerrorlines pt 7 lw 2 lc rgb "#1f77b4" t "AdaRound", \
     "plotdata/acc_res_cnn.dat" u ($1+0.023):13 w points pt 6 ps 1.6 lc rgb "#1f77b4" t "AdaRound int8 device", \
     "plotdata/acc_res_cnn.dat" u ($1+0.070):14:15 w yerrorlines pt 7 lw 2 lc rgb "#2ca02c" t "BRECQ+QDrop", \
     "plotdata/acc_res_cnn.dat" u ($1+0.070):16 w points pt 6 ps 1.6 lc rgb "#2ca02c" t "BRECQ+QDrop int8 device"
set title "mobilenet_onnx"
plot "plotdata/acc_mobilenet_onnx.dat" u 1:3:xtic(2) w lines dt 2 lw 2 lc rgb "#555555" t "fp32", \
     "plotdata/acc_mobilenet_onnx.dat" u ($1-0.070):5:6 w yerrorlines pt 7 lw 2 lc rgb "#d62728" t "PTQ-MSE", \
     "plotdata/acc_mobilenet_onnx.dat" u ($1-0.070):7 w points pt 6 ps 1.6 lc rgb "#d62728" t "PTQ-MSE int8 device", \
     "plotdata/acc_mobilenet_onnx.dat" u ($1-0.023):8:9 w yerrorlines pt 7 lw 2 lc rgb "#ff7f0e" t "PTQ-MSE+CLE+BC", \
     "plotdata/acc_mobilenet_onnx.dat" u ($1-0.023):10 w points pt 6 ps 1.6 lc rgb "#ff7f0e" t "PTQ-MSE+CLE+BC int8 device", \
     "plotdata/acc_mobilenet_onnx.dat" u ($1+0.023):11:12 w yerrorlines pt 7 lw 2 lc rgb "#1f77b4" t "AdaRound", \
     "plotdata/acc_mobilenet_onnx.dat" u ($1+0.023):13 w points pt 6 ps 1.6 lc rgb "#1f77b4" t "AdaRound int8 device", \
     "plotdata/acc_mobilenet_onnx.dat" u ($1+0.070):14:15 w yerrorlines pt 7 lw 2 lc rgb "#2ca02c" t "BRECQ+QDrop", \
     "plotdata/acc_mobilenet_onnx.dat" u ($1+0.070):16 w points pt 6 ps 1.6 lc rgb "#2ca02c" t "BRECQ+QDrop int8 device"
unset multiplot
unset xrange
unset xlabel
set output
