/* Backend descriptions (backend.h): the [accelerator] INI file that describes an accelerator
 * (qt_backend_desc_load, qt_backend_desc_parse), parsed with the config schema machinery. */
#include <stdlib.h>
#include <string.h>

#include "backend/runtimes.h"
#include "config/config.h"

static const qt_cfg_key accel_schema[] = {
    {"accelerator", "name", QT_CFG_STRING, "accelerator", 0, 0, NULL, "the accelerator's name (reports)"},
    {"accelerator", "ops", QT_CFG_STRING, "", 0, 0, NULL, "ops it runs on integers, comma-separated op names"},
    {"accelerator", "weight_bits", QT_CFG_STRING, "8", 0, 0, NULL, "allowed weight bit widths, comma-separated"},
    {"accelerator", "activation_bits", QT_CFG_STRING, "8", 0, 0, NULL, "allowed activation bit widths"},
    {"accelerator", "per_tensor_only", QT_CFG_BOOL, "true", 0, 0, NULL, "one scale per tensor (weights too)"},
    {"accelerator", "symmetric", QT_CFG_BOOL, "true", 0, 0, NULL, "signed ranges with zero point 0"},
    {"accelerator", "power_of_two_scales", QT_CFG_BOOL, "true", 0, 0, NULL, "scales must be powers of two"},
    {"accelerator", "max_channels", QT_CFG_INT, "0", 0, 1e6, NULL,
     "most output channels (conv2d) / features (linear) a layer may have; 0 = any"},
    {"accelerator", "int32_bias", QT_CFG_BOOL, "false", 0, 0, NULL,
     "optional: true when the accelerator adds biases only as int32 in accumulator units (the Quantizer then "
     "quantizes every bias at s_x * s_w); false: the device rounds a float bias itself"},
};
#define N_REQUIRED_ACCEL_KEYS 8 /* the keys before int32_bias, which came later and is optional */
#define N_ACCEL_KEYS ((int)(sizeof accel_schema / sizeof accel_schema[0]))

static void trim(char *s) {
  size_t a = 0, n = strlen(s);
  while (s[a] == ' ' || s[a] == '\t') a++;
  while (n > a && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
  memmove(s, s + a, n - a);
  s[n - a] = 0;
}

static int parse_bits(const qt_config *c, const char *key, unsigned *mask, char *err) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", qt_config_string(c, "accelerator", key));
  *mask = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    trim(t);
    char *end;
    long b = strtol(t, &end, 10);
    if (!*t || *end || b < 2 || b > 8) {
      snprintf(err, QT_ERR_LEN,
               "config: %s: [accelerator] %s: expected bit widths in 2..8 separated by commas, "
               "found '%s'",
               qt_config_origin(c, "accelerator", key), key, t);
      return -1;
    }
    *mask |= 1u << b;
  }
  if (!*mask) {
    snprintf(err, QT_ERR_LEN, "config: %s: [accelerator] %s: no bit width given",
             qt_config_origin(c, "accelerator", key), key);
    return -1;
  }
  return 0;
}

static int desc_from_config(qt_backend_desc *d, const qt_config *c, const char *origin, char *err) {
  memset(d, 0, sizeof *d);
  /* A hardware description states everything: a forgotten key would silently change the
   * Quantizer, so every key must be set by the file. */
  for (int k = 0; k < N_REQUIRED_ACCEL_KEYS; k++)
    if (strcmp(qt_config_origin(c, "accelerator", accel_schema[k].key), "default") == 0) {
      snprintf(err, QT_ERR_LEN,
               "config: %s: [accelerator] %s: missing; an accelerator description sets every key "
               "(name, ops, weight_bits, activation_bits, per_tensor_only, symmetric, power_of_two_scales, "
               "max_channels)",
               origin, accel_schema[k].key);
      return -1;
    }
  const char *name = qt_config_string(c, "accelerator", "name");
  if (!name[0] || strlen(name) >= QT_NAME_LEN || strpbrk(name, " /\t")) {
    snprintf(err, QT_ERR_LEN,
             "config: %s: [accelerator] name: expected 1..%d characters without spaces or '/', found "
             "'%s'",
             qt_config_origin(c, "accelerator", "name"), QT_NAME_LEN - 1, name);
    return -1;
  }
  snprintf(d->name, sizeof d->name, "%s", name);
  char buf[512];
  snprintf(buf, sizeof buf, "%s", qt_config_string(c, "accelerator", "ops"));
  int n_ops = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    trim(t);
    qt_op op;
    if (qt_op_parse(t, &op) || op == QT_OP_INPUT || op == QT_OP_QUANTIZE || op == QT_OP_DEQUANTIZE ||
        op == QT_OP_FAKE_QUANT || op == QT_OP_CONV_BN) {
      snprintf(err, QT_ERR_LEN,
               "config: %s: [accelerator] ops: '%s' is not a compute op of Q/DQ graphs (known: "
               "conv2d, batch_norm, relu, relu6, max_pool2d, avg_pool2d, global_avg_pool, flatten, linear, add)",
               qt_config_origin(c, "accelerator", "ops"), t);
      return -1;
    }
    d->ops[op] = 1;
    n_ops++;
  }
  if (!n_ops) {
    snprintf(err, QT_ERR_LEN, "config: %s: [accelerator] ops: empty; list the ops the accelerator runs",
             qt_config_origin(c, "accelerator", "ops"));
    return -1;
  }
  if (parse_bits(c, "weight_bits", &d->weight_bits, err) || parse_bits(c, "activation_bits", &d->activation_bits, err))
    return -1;
  const int per_tensor = qt_config_bool(c, "accelerator", "per_tensor_only");
  const int symmetric = qt_config_bool(c, "accelerator", "symmetric");
  d->weight_per_tensor_only = per_tensor;
  d->activation_per_tensor_only = 1; /* per-channel activations exist on no backend here */
  d->weight_symmetric = d->activation_symmetric = symmetric;
  d->weight_sign = QT_SIGN_SIGNED;
  d->activation_sign = symmetric ? QT_SIGN_SIGNED : QT_SIGN_ANY;
  d->pow2_scales = qt_config_bool(c, "accelerator", "power_of_two_scales");
  d->max_channels = qt_config_int(c, "accelerator", "max_channels");
  d->pair_sum_int16 = 0; /* int32 accumulation throughout */
  d->bias_int32_only = qt_config_bool(c, "accelerator", "int32_bias");
  snprintf(d->isa, sizeof d->isa, "accelerator");
  return 0;
}

static int desc_load(qt_backend_desc *d, const char *path, const char *text, const char *origin, char *err) {
  qt_config *c = qt_config_create(accel_schema, N_ACCEL_KEYS);
  QT_ASSERT(c, "out of memory");
  int rc = path ? qt_config_load_file(c, path, err) : qt_config_load_string(c, text, origin, err);
  if (!rc) rc = desc_from_config(d, c, path ? path : origin ? origin : "<string>", err);
  qt_config_free(c);
  return rc;
}

int qt_backend_desc_load(qt_backend_desc *d, const char *path, char *err) {
  return desc_load(d, path, NULL, NULL, err);
}

int qt_backend_desc_parse(qt_backend_desc *d, const char *text, const char *origin, char *err) {
  return desc_load(d, NULL, text, origin, err);
}
