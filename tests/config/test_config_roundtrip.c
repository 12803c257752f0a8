/* The resolved configuration written as INI (qt_config_write_ini / qt_config_to_ini_string)
 * loads back, into a fresh config, to identical values for every key, and writing that config
 * again gives the same key lines. */
#include "schema.h"
#include "tests/common/testutil.h"

/* Every value as canonical text, for comparison. */
static void snapshot(const qt_config *c, char out[][256]) {
  for (int i = 0; i < TEST_SCHEMA_N; i++) {
    const qt_cfg_key *k = &test_schema[i];
    switch (k->type) {
    case QT_CFG_INT: snprintf(out[i], 256, "%lld", (long long)qt_config_int64(c, k->section, k->key)); break;
    case QT_CFG_FLOAT: snprintf(out[i], 256, "%a", qt_config_float(c, k->section, k->key)); break;
    case QT_CFG_BOOL: snprintf(out[i], 256, "%d", qt_config_bool(c, k->section, k->key)); break;
    default: snprintf(out[i], 256, "%s", qt_config_string(c, k->section, k->key)); break;
    }
  }
}

/* The non-comment lines of an INI text, concatenated. */
static void key_lines(const char *text, char *out, size_t len) {
  out[0] = '\0';
  for (const char *p = text; *p;) {
    size_t n = strcspn(p, "\n");
    if (n && *p != ';') snprintf(out + strlen(out), len - strlen(out), "%.*s\n", (int)n, p);
    p += n + (p[n] == '\n');
  }
}

static void check_round_trip(qt_config *a, const char *label) {
  char err[QT_ERR_LEN] = "";
  char want[TEST_SCHEMA_N][256], got[TEST_SCHEMA_N][256];
  char *text = qt_config_to_ini_string(a);
  QT_CHECK(text != NULL);
  if (!text) return;
  qt_config *b = qt_config_create(test_schema, TEST_SCHEMA_N);
  if (qt_config_load_string(b, text, "written.ini", err) != 0)
    qt_test_fail("%s: reload failed: %s\n%s", label, err, text);
  snapshot(a, want);
  snapshot(b, got);
  for (int i = 0; i < TEST_SCHEMA_N; i++)
    if (strcmp(want[i], got[i]) != 0)
      qt_test_fail("%s: [%s] %s: '%s' became '%s'", label, test_schema[i].section, test_schema[i].key,
                   want[i], got[i]);
  /* Every key comes from the written file. */
  for (int i = 0; i < TEST_SCHEMA_N; i++)
    if (strncmp(qt_config_origin(b, test_schema[i].section, test_schema[i].key), "written.ini:", 12) != 0)
      qt_test_fail("%s: [%s] %s not written", label, test_schema[i].section, test_schema[i].key);
  char *again = qt_config_to_ini_string(b);
  static char lines_a[16384], lines_b[16384];
  key_lines(text, lines_a, sizeof lines_a);
  key_lines(again, lines_b, sizeof lines_b);
  if (strcmp(lines_a, lines_b) != 0)
    qt_test_fail("%s: second write differs:\n%s---\n%s", label, lines_a, lines_b);

  /* The same through a file written by qt_config_write_ini. */
  FILE *f = fopen("roundtrip.ini", "w");
  QT_CHECK(f && qt_config_write_ini(a, f) == 0);
  if (f) fclose(f);
  qt_config *d = qt_config_create(test_schema, TEST_SCHEMA_N);
  if (qt_config_load_file(d, "roundtrip.ini", err) != 0)
    qt_test_fail("%s: file reload failed: %s", label, err);
  snapshot(d, got);
  for (int i = 0; i < TEST_SCHEMA_N; i++)
    if (strcmp(want[i], got[i]) != 0)
      qt_test_fail("%s: file: [%s] %s differs", label, test_schema[i].section, test_schema[i].key);
  remove("roundtrip.ini");
  qt_config_free(d);
  free(again);
  free(text);
  qt_config_free(b);
}

int main(void) {
  char err[QT_ERR_LEN] = "";
  qt_config *a = qt_config_create(test_schema, TEST_SCHEMA_N);
  check_round_trip(a, "defaults");

  QT_CHECK(qt_config_load_string(a,
                                 "[train]\nepochs = 9\naugment = ON\nseed = -123456789\n"
                                 "[optim]\nkind = adamw\nlr = 0.1\nweight_decay = 1.25e-7\nshift = -1e-300\n",
                                 "a.ini", err) == 0);
  const char *overrides[] = {"optim.momentum=0.30000000000000004", "train.checkpoint=runs/x y;z/#1 [a] b=c:d",
                             "schedule.kind=STEP", "train.max_images=9223372036854775807"};
  for (size_t i = 0; i < sizeof overrides / sizeof overrides[0]; i++)
    if (qt_config_apply_override(a, overrides[i], err) != 0)
      qt_test_fail("override %s: %s", overrides[i], err);
  check_round_trip(a, "modified");

  /* The longest string a line can hold. */
  char path[200];
  memset(path, 'p', sizeof path);
  path[197 - strlen("path = ")] = '\0';
  QT_CHECK(qt_config_set(a, "data", "path", path, err) == 0);
  check_round_trip(a, "long string");
  path[strlen(path)] = 'p';
  path[198 - strlen("path = ")] = '\0';
  QT_CHECK(qt_config_set(a, "data", "path", path, err) == -1);

  qt_config_free(a);
  return qt_test_finish();
}
