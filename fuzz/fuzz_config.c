/* Fuzz target: the INI config parser and the option resolver (config/config.h, train/options.h).
 *
 * Input: an INI file, optionally followed by command-line overrides, each after QT_FUZZ_SEP
 * ("section.key=value"; at most 16). The file goes through qt_options_load (file, overrides,
 * resolver with every cross-key rule); the same text through qt_config_load_string must give
 * the same verdict. A config that resolves must round-trip as a checkpoint stores it: its
 * qt_options_to_ini text loads and resolves again to the same values, and
 * qt_options_resume_matches accepts it for the run itself. */
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_util.h"
#include "train/options.h"

#define MAX_OVERRIDES 16

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return 0;
}

static char *dup_part(const uint8_t *p, size_t n) {
  char *s = malloc(n + 1);
  QT_ASSERT(s, "out of memory");
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}

/* The text without its comment lines (origins differ between loads). */
static void strip_comments(char *s) {
  char *out = s;
  for (char *line = s; *line;) {
    char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line + 1) : strlen(line);
    if (line[0] != ';' && line[0] != '#') {
      memmove(out, line, len);
      out += len;
    }
    line += len;
  }
  *out = 0;
}

/* The stored form of resolved options reads back to the same options. */
static void check_round_trip(const qt_options *o) {
  static qt_options again;
  char err[QT_ERR_LEN] = "";
  char *ini = qt_options_to_ini(o);
  QT_ASSERT(ini, "out of memory");
  qt_config *c = qt_train_config_create();
  QT_ASSERT(c, "out of memory");
  QT_ASSERT(qt_config_load_string(c, ini, "stored", err) == 0, "resolved options do not load back: %s", err);
  QT_ASSERT(qt_options_resolve(c, &again, err) == 0, "resolved options do not resolve again: %s", err);
  qt_config_free(c);
  char *ini2 = qt_options_to_ini(&again);
  QT_ASSERT(ini2, "out of memory");
  strip_comments(ini);
  strip_comments(ini2);
  QT_ASSERT(strcmp(ini, ini2) == 0, "options change when stored and loaded back:\n%s\n---\n%s", ini, ini2);
  QT_ASSERT(qt_options_resume_matches(o, ini, "stored", err) == 0, "a run does not resume its own config: %s", err);
  free(ini2);
  free(ini);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 16) return 0;
  const uint8_t *part[MAX_OVERRIDES + 1];
  size_t len[MAX_OVERRIDES + 1];
  const int n = qt_fuzz_split(data, size, part, len, MAX_OVERRIDES + 1);
  const char *path = qt_fuzz_path(0, "config.ini");
  qt_fuzz_write_file(path, part[0], len[0]);
  char *overrides[MAX_OVERRIDES];
  for (int i = 1; i < n; i++) overrides[i - 1] = dup_part(part[i], len[i]);

  static qt_options o, o2;
  char err[QT_ERR_LEN] = "", err2[QT_ERR_LEN] = "";
  const int rc = qt_options_load(path, overrides, n - 1, &o, err);
  QT_ASSERT(rc == 0 || rc == -1, "qt_options_load returned %d", rc);
  QT_ASSERT(rc == 0 || err[0], "a refused config without a message");

  /* The same text from memory (when it holds no NUL, which a string cannot carry). */
  if (!memchr(part[0], 0, len[0])) {
    char *text = dup_part(part[0], len[0]);
    qt_config *c = qt_train_config_create();
    QT_ASSERT(c, "out of memory");
    int rc2 = qt_config_load_string(c, text, path, err2);
    for (int i = 1; i < n && rc2 == 0; i++) rc2 = qt_config_apply_override(c, overrides[i - 1], err2);
    if (rc2 == 0) rc2 = qt_options_resolve(c, &o2, err2);
    QT_ASSERT(rc2 == rc, "file and string loads disagree: %d '%s' / %d '%s'", rc, err, rc2, err2);
    qt_config_free(c);
    free(text);
  }
  if (rc == 0) check_round_trip(&o);
  for (int i = 1; i < n; i++) free(overrides[i - 1]);
  return 0;
}
