/* The kernels of autograd/cpu_conv1_pool.c, included there twice (see the comment before the
 * includes): with C1P_SUFFIX _lit and C1P_UNROLL(n) as #pragma GCC unroll n, and with C1P_SUFFIX
 * _gen and C1P_UNROLL(n) empty. Not a header of its own: it uses that file's vector helpers and
 * defines static functions. No include guard, on purpose. */
/* The patch moments of one padded image, in double: without CROSS, S (K), the sums of its
 * patches, then the upper triangle of G (row by row, s >= t), the sums of u_s u_t; with CROSS,
 * Sh (K), the sums of the padded coefficient image hp's patches, then H (K x K, row s, column t),
 * the sums of u_s v_t (u the image's patch, v hp's). Literal KH, KW and CROSS: the loops unroll
 * and the accumulators stay in registers where they fit. */
C1P_INLINE void C1P_FN(patch_moments_k)(double *out, const float *xp, const float *hp, const qt_conv1_pool_shape *s,
                                        const int KH, const int KW, const int CROSS) {
  const int K = KH * KW, PWd = padded_width(s), n_acc = K + (CROSS ? K * K : K * (K + 1) / 2);
  /* the float lanes of every accumulator, then summed in double lane by lane */
  v16f acc[QT_CONV1_POOL_MAX_TAPS + QT_CONV1_POOL_MAX_TAPS * QT_CONV1_POOL_MAX_TAPS];
  if (!CROSS) { /* one pass: the upper triangle's accumulators spill less than passes cost */
    C1P_UNROLL(128)
    for (int a = 0; a < n_acc; a++) acc[a] = splat16(0.0f);
    for (int oh = 0; oh < s->OH; oh++)
      for (int ow0 = 0; ow0 < s->OW; ow0 += 16) {
        const v16i in_row = lanes_below(s->OW - ow0);
        v16f u[QT_CONV1_POOL_MAX_TAPS], vm[QT_CONV1_POOL_MAX_TAPS]; /* vm: the summed patch, lanes past OW 0 */
        C1P_UNROLL(32)
        for (int t = 0; t < K; t++) {
          u[t] = ld16(xp + (size_t)(oh + t / KW) * PWd + ow0 + t % KW);
          vm[t] = sel16(in_row, u[t], splat16(0.0f));
          acc[t] += vm[t];
        }
        int p = K;
        C1P_UNROLL(32)
        for (int a = 0; a < K; a++) C1P_UNROLL(32)
        for (int t = a; t < K; t++, p++) acc[p] = fma16(vm[a], u[t], acc[p]);
      }
  }
  /* With CROSS, one pass over the image per accumulator row (a = -1: the patch sums; a >= 0: the
   * products with u_a), so a pass's accumulators stay in registers where the K * K + K of one pass
   * would spill; each accumulator gets the same operations in the same order as one pass over all
   * of them would give (over oh, then ow0). */
  for (int a = -1; CROSS && a < K; a++) {
    v16f pa[QT_CONV1_POOL_MAX_TAPS];
    C1P_UNROLL(32)
    for (int t = 0; t < K; t++) pa[t] = splat16(0.0f);
    for (int oh = 0; oh < s->OH; oh++)
      for (int ow0 = 0; ow0 < s->OW; ow0 += 16) {
        const v16i in_row = lanes_below(s->OW - ow0);
        const v16f ua = a < 0 ? splat16(0.0f) : ld16(xp + (size_t)(oh + a / KW) * PWd + ow0 + a % KW);
        C1P_UNROLL(32)
        for (int t = 0; t < K; t++) {
          const size_t pt = (size_t)(oh + t / KW) * PWd + ow0 + t % KW;
          const v16f vm = sel16(in_row, ld16(hp + pt), splat16(0.0f)); /* lanes past OW 0 */
          pa[t] = a < 0 ? pa[t] + vm : fma16(ua, vm, pa[t]);
        }
      }
    C1P_UNROLL(32)
    for (int t = 0; t < K; t++) acc[(a < 0 ? 0 : K + a * K) + t] = pa[t];
  }
  /* in double, lane by lane in lane order per accumulator; the accumulators side by side */
  for (int a = 0; a < n_acc; a++) out[a] = 0;
  for (int j = 0; j < 16; j++)
    for (int a = 0; a < n_acc; a++) out[a] += (double)acc[a][j];
}

/* NP consecutive pooled outputs (OS floats apart) of one row (ph, from pw) of one image for channels
 * [16v, 16v+16): the convolution recomputed at every window input, the NP * PK * PK sums as
 * independent chains over the taps (in tap order, bias first), then normalized, clamped, fake
 * quantized (FQ) and pooled in window order with max pool's comparison, as
 * qt_batch_norm_relu_pool_forward_train's bn_pool_band does. Literal KH, KW, PK, RELU, FQ, NP. */
C1P_INLINE void C1P_FN(pool_outputs)(float *out, uint8_t *argmax, float *yarg, uint8_t *qmask, const float *xp, int PWd,
                                     int ph, int pw, size_t o, int OS, const v16f *w, v16f b0, const norm16 *nc,
                                     const qt_fq_params *fq, const int KH, const int KW, const int PK, const int RELU,
                                     const int FQ, const int NP) {
  v16f y[QT_CONV1_POOL_MAX_WINDOW * QT_CONV1_POOL_MAX_WINDOW]; /* NP * PK * PK: 2 * 3 * 3 or 1 * PK * PK */
  C1P_UNROLL(64)
  for (int c = 0; c < NP * PK * PK; c++) y[c] = b0;
  C1P_UNROLL(32)
  for (int t = 0; t < KH * KW; t++) {
    const int kh = t / KW, kw = t % KW;
    C1P_UNROLL(64)
    for (int c = 0; c < NP * PK * PK; c++) {
      const int i = c / (PK * PK), jh = c % (PK * PK) / PK, jw = c % PK;
      const float x = xp[(size_t)(ph * PK + jh + kh) * PWd + (pw + i) * PK + jw + kw];
      y[c] = fma16(w[t], splat16(x), y[c]);
    }
  }
  C1P_UNROLL(8)
  for (int i = 0; i < NP; i++) {
    v16f ya = norm_relu(y[i * PK * PK], nc->mh, nc->ml, nc->a, nc->bt, RELU);
    v16f best = FQ ? fake_quant16(ya, fq) : ya;
    v16i at = {0};
    C1P_UNROLL(64)
    for (int j = 1; j < PK * PK; j++) {
      const v16f z = norm_relu(y[i * PK * PK + j], nc->mh, nc->ml, nc->a, nc->bt, RELU);
      const v16f q = FQ ? fake_quant16(z, fq) : z;
      const v16i take = (q > best) | (q != q);
      best = sel16(take, q, best);
      if (FQ) ya = sel16(take, z, ya);
      at = (take & j) | (~take & at);
    }
    const size_t oi = o + (size_t)i * OS;
    st16(out + oi, best);
    for (int j = 0; j < 16; j++) argmax[oi + j] = (uint8_t)at[j];
    if (FQ && yarg) st16(yarg + oi, ya);
    if (FQ && qmask) {
      const float inv_s = 1.0f / fq->scale, zpf = (float)fq->zero_point, lo = (float)fq->qmin, hi = (float)fq->qmax;
      for (int j = 0; j < 16; j++) {
        const float q = quant_round(ya[j], inv_s, zpf);
        qmask[oi + j] = (uint8_t)((q >= lo) & (q <= hi) & qt_relu_passes(ya[j], RELU));
      }
    }
  }
}

/* One image's pooled outputs (and window positions of the maxima), with literal KH, KW, PK, RELU
 * and FQ: per channel block, its taps' weights in registers, two pooled outputs at a time. */
C1P_INLINE void C1P_FN(image_pool_k)(float *out, uint8_t *argmax, float *yarg, uint8_t *qmask, const float *xp,
                                     const float *wT, const float *bias, const float *chi, const float *clo,
                                     const float *ca, const float *bb, const qt_fq_params *fq,
                                     const qt_conv1_pool_shape *s, const int KH, const int KW, const int PK,
                                     const int RELU, const int FQ) {
  const int OC = s->OC, PWd = padded_width(s), PH = s->OH / PK, PW = s->OW / PK;
  const int OS = out_pixel_stride(s);
  for (int v = 0; v < OC / 16; v++) {
    const size_t ov = out_block_offset(s, v);
    v16f w[QT_CONV1_POOL_MAX_TAPS];
    C1P_UNROLL(32)
    for (int t = 0; t < KH * KW; t++) w[t] = ld16(wT + (size_t)t * OC + 16 * v);
    const v16f b0 = bias ? ld16(bias + 16 * v) : splat16(0.0f);
    const norm16 nc = {ld16(chi + 16 * v), ld16(clo + 16 * v), ld16(ca + 16 * v), ld16(bb + 16 * v)};
    for (int ph = 0; ph < PH; ph++) {
      int pw = 0;
      if (PK <= 3)
        for (; pw + 2 <= PW; pw += 2) C1P_FN(pool_outputs)
      (out, argmax, yarg, qmask, xp, PWd, ph, pw, ((size_t)ph * PW + pw) * OS + ov, OS, w, b0, &nc, fq, KH, KW, PK,
       RELU, FQ, 2);
      for (; pw < PW; pw++) C1P_FN(pool_outputs)
      (out, argmax, yarg, qmask, xp, PWd, ph, pw, ((size_t)ph * PW + pw) * OS + ov, OS, w, b0, &nc, fq, KH, KW, PK,
       RELU, FQ, 1);
    }
  }
}

/* One image's P (K per channel), dbeta and, with HP, P of the coefficient image (Ph), from g's
 * values (grad_value; the image's outputs from obase on), the gradient batch norm's output
 * receives at each window's argmax input; literal KH, KW, PK, HP: per channel block one
 * accumulator per tap (and per tap of Ph). */
C1P_INLINE void C1P_FN(image_grad_sums)(double *P, double *Ph, double *db, const c1p_grad *g, size_t obase,
                                        const uint8_t *argmax, const float *xp, const float *hp,
                                        const qt_conv1_pool_shape *s, const int KH, const int KW, const int PK,
                                        const int HP) {
  const int OC = s->OC, PWd = padded_width(s), PH = s->OH / PK, PW = s->OW / PK, OS = out_pixel_stride(s);
  const v16f zero = splat16(0.0f);
  for (int v = 0; v < OC / 16; v++) {
    const size_t ov = out_block_offset(s, v);
    v16f acc[QT_CONV1_POOL_MAX_TAPS], acch[QT_CONV1_POOL_MAX_TAPS], dsum = zero;
    C1P_UNROLL(32)
    for (int t = 0; t < KH * KW; t++) acc[t] = acch[t] = zero;
    for (int ph = 0; ph < PH; ph++)
      for (int pw = 0; pw < PW; pw++) {
        const size_t o = ((size_t)ph * PW + pw) * OS + ov;
        const v16f gv = grad_value(g, obase + o);
        dsum += gv;
        const v16i at = ld16_u8(argmax + o);
        const size_t po = (size_t)(ph * PK) * PWd + pw * PK;
        /* per lane, the tap's input at the lane's argmax window position, selected from the
         * window's PK * PK candidates, then one FMA: the sum the masked FMAs over every position
         * would give (theirs add exact zeros elsewhere) */
        v16i is[QT_CONV1_POOL_MAX_WINDOW * QT_CONV1_POOL_MAX_WINDOW];
        C1P_UNROLL(64)
        for (int j = 1; j < PK * PK; j++) is[j] = at == j;
        C1P_UNROLL(32)
        for (int t = 0; t < KH * KW; t++) {
          const size_t pt = po + (size_t)(t / KW) * PWd + t % KW;
          v16f xa = splat16(xp[pt]), ha = HP ? splat16(hp[pt]) : zero;
          C1P_UNROLL(64)
          for (int j = 1; j < PK * PK; j++) {
            const size_t pj = pt + (size_t)(j / PK) * PWd + j % PK;
            xa = sel16(is[j], splat16(xp[pj]), xa);
            if (HP) ha = sel16(is[j], splat16(hp[pj]), ha);
          }
          acc[t] = fma16(gv, xa, acc[t]);
          if (HP) acch[t] = fma16(gv, ha, acch[t]);
        }
      }
    for (int j = 0; j < 16; j++) {
      const int oc = 16 * v + j;
      db[oc] = (double)dsum[j];
      for (int t = 0; t < KH * KW; t++) {
        P[(size_t)oc * KH * KW + t] = (double)acc[t][j];
        if (HP) Ph[(size_t)oc * KH * KW + t] = (double)acch[t][j];
      }
    }
  }
}
