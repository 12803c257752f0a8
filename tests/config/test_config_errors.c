/* Every kind of bad input gives its own message naming the file, line, section, key, what was
 * expected and what was found; a failed load or override changes nothing. */
#include "schema.h"
#include "tests/common/testutil.h"

#include <stdarg.h>

/* rc must be -1 and err must contain every given substring (NULL-terminated list).
 * QT_TEST_VERBOSE=1 prints every message, to read them. */
static void expect_error(int line, int rc, const char *err, ...) {
  if (getenv("QT_TEST_VERBOSE")) fprintf(stderr, "%s\n", err);
  if (rc != -1) qt_test_fail("%s:%d: expected failure, got rc %d", __FILE__, line, rc);
  va_list ap;
  va_start(ap, err);
  for (const char *want = va_arg(ap, const char *); want; want = va_arg(ap, const char *))
    if (!strstr(err, want)) qt_test_fail("%s:%d: message\n    %s\n  lacks '%s'", __FILE__, line, err, want);
  va_end(ap);
  if (strncmp(err, "config: ", 8) != 0)
    qt_test_fail("%s:%d: message '%s' lacks the 'config: ' prefix", __FILE__, line, err);
}
#define EXPECT_ERROR(rc, ...) expect_error(__LINE__, (rc), err, __VA_ARGS__, (const char *)NULL)

/* Loads text from a file named path and returns the rc. */
static int load_text(qt_config *c, const char *path, const char *text, char *err) {
  write_file(path, text);
  int rc = qt_config_load_file(c, path, err);
  remove(path);
  return rc;
}

int main(void) {
  char err[QT_ERR_LEN];
  qt_config *c = qt_config_create(test_schema, TEST_SCHEMA_N);
  QT_CHECK(c != NULL);

  /* Missing / unreadable file. */
  remove("nope.ini");
  err[0] = '\0';
  QT_CHECK(qt_config_load_file(c, "nope.ini", err) == -1);
  QT_CHECK(strcmp(err, "config: cannot open 'nope.ini': No such file or directory") == 0);
  EXPECT_ERROR(qt_config_load_file(c, ".", err), "cannot read '.'", "Is a directory");

  /* Syntax errors, with file and line. */
  EXPECT_ERROR(load_text(c, "syntax.ini", "; comment\n[train]\nepochs 5\n", err),
               "config: syntax.ini:3: syntax error", "found 'epochs 5'");
  EXPECT_ERROR(load_text(c, "header.ini", "[train]\nepochs = 5\n\n[optim\nlr = 0.1\n", err),
               "config: header.ini:4: syntax error", "expected ']'", "found '[optim'");

  /* Unknown section: named at its header, even when it holds no keys; known sections listed. */
  EXPECT_ERROR(load_text(c, "section.ini", "[train]\nepochs = 5\n[trian]\n", err),
               "config: section.ini:3: unknown section [trian]", "did you mean [train]?",
               "known sections: [train], [optim], [schedule], [data]");
  EXPECT_ERROR(load_text(c, "section2.ini", "[model]\nwidth = 3\n", err),
               "section2.ini:1: unknown section [model]", "known sections:");
  EXPECT_ERROR(load_text(c, "nosection.ini", "epochs = 5\n", err),
               "config: nosection.ini:1: key 'epochs' is outside any section");

  /* Unknown key: a suggestion by edit distance, the right section, or the list of keys. */
  EXPECT_ERROR(load_text(c, "key.ini", "[train]\nbatch_size = 64\n; typo below\nepoch = 5\n", err),
               "config: key.ini:4: unknown key 'epoch' in section [train]; did you mean 'epochs'?");
  EXPECT_ERROR(load_text(c, "key2.ini", "[optim]\nLearningrate = 0.1\n", err),
               "key2.ini:2: unknown key 'Learningrate' in section [optim]",
               "(known keys: kind, lr, momentum");
  EXPECT_ERROR(load_text(c, "key3.ini", "[train]\nlr = 0.1\n", err),
               "key3.ini:2: unknown key 'lr' in section [train]; 'lr' belongs to section [optim]");
  EXPECT_ERROR(load_text(c, "key4.ini", "[optim]\nweight_dcay = 0.1\n", err), "did you mean 'weight_decay'?");

  /* Bad values: what was expected and what was found. */
  EXPECT_ERROR(load_text(c, "value.ini", "[train]\n\nepochs = ten\n", err),
               "config: value.ini:3: [train] epochs: expected an integer in [1, 100000], found 'ten'");
  const struct {
    const char *text, *want;
  } bad_values[] = {
      {"[train]\nepochs = 0\n", "v.ini:2: [train] epochs: expected an integer in [1, 100000], found '0'"},
      {"[train]\nepochs = 5.5\n", "found '5.5'"},
      {"[train]\nepochs =\n", "expected an integer in [1, 100000], found ''"},
      {"[train]\nseed = 99999999999999999999\n", "[train] seed: expected an integer, found '99999999999999999999'"},
      {"[train]\nmax_images = -1\n", "expected an integer >= 0, found '-1'"},
      {"[optim]\nlr = 0.1x\n", "v.ini:2: [optim] lr: expected a finite number in [0, 10], found '0.1x'"},
      {"[optim]\nlr = nan\n", "found 'nan'"},
      {"[optim]\nlr = inf\n", "found 'inf'"},
      {"[optim]\nweight_decay = 1e999\n", "expected a finite number >= 0, found '1e999'"},
      {"[optim]\nlr = 11\n", "expected a finite number in [0, 10], found '11'"},
      {"[optim]\nmomentum = 0.5\nshift = 0.5\n", "v.ini:3: [optim] shift: expected a finite number <= 0, found '0.5'"},
      {"[train]\naugment = maybe\n",
       "[train] augment: expected a boolean (true/false, yes/no, on/off, 1/0), found 'maybe'"},
      {"[optim]\nkind = adam\n", "v.ini:2: [optim] kind: expected one of 'sgd', 'adamw', found 'adam'"},
  };
  for (size_t k = 0; k < sizeof bad_values / sizeof bad_values[0]; k++)
    EXPECT_ERROR(load_text(c, "v.ini", bad_values[k].text, err), bad_values[k].want);

  /* Duplicate key within one file (also across two blocks of the same section). */
  EXPECT_ERROR(load_text(c, "dup.ini", "[optim]\nlr = 0.1\nmomentum = 0.8\nlr = 0.2\n", err),
               "config: dup.ini:4: duplicate key 'lr' in section [optim] (first set at dup.ini:2)");
  EXPECT_ERROR(load_text(c, "dup2.ini", "[optim]\nlr = 0.1\n[train]\nepochs = 2\n[optim]\nlr = 0.2\n", err),
               "dup2.ini:6: duplicate key 'lr' in section [optim] (first set at dup2.ini:2)");

  /* A line too long for the INI reader. */
  {
    char text[400];
    snprintf(text, sizeof text, "[data]\npath = /%0250d\n", 0);
    EXPECT_ERROR(load_text(c, "long.ini", text, err), "long.ini:2: line is 258 characters long; at most 197");
  }

  /* The first error in the file wins, whatever its kind. */
  EXPECT_ERROR(load_text(c, "first.ini", "[train]\nepochs = x\nbad line\n", err),
               "first.ini:2: [train] epochs");
  EXPECT_ERROR(load_text(c, "first.ini", "[train]\nbad line\nepochs = x\n", err),
               "first.ini:2: syntax error");
  EXPECT_ERROR(load_text(c, "first.ini", "[train]\nepochs = 3\n[nope]\nbad line\n", err),
               "first.ini:3: unknown section");

  /* load_string names its origin. */
  EXPECT_ERROR(qt_config_load_string(c, "[train]\nepochs = -3\n", "checkpoint.bin", err),
               "config: checkpoint.bin:2: [train] epochs: expected an integer in [1, 100000], found '-3'");
  EXPECT_ERROR(qt_config_load_string(c, "[train]\nepochs = -3\n", NULL, err), "config: <string>:2:");

  /* Overrides. */
  EXPECT_ERROR(qt_config_apply_override(c, "train.epochs", err),
               "config: override 'train.epochs': expected section.key=value, found no '='");
  EXPECT_ERROR(qt_config_apply_override(c, "epochs=5", err),
               "config: override 'epochs=5': expected section.key=value, found no 'section.' before 'epochs'",
               "did you mean 'train.epochs=5'?");
  EXPECT_ERROR(qt_config_apply_override(c, "kind=adamw", err), "found no 'section.' before 'kind'");
  EXPECT_ERROR(
      qt_config_apply_override(c, "train.epoch=5", err),
      "config: override 'train.epoch=5': unknown key 'epoch' in section [train]; did you mean 'epochs'?");
  EXPECT_ERROR(qt_config_apply_override(c, "trian.epochs=5", err),
               "config: override 'trian.epochs=5': unknown section [trian]; did you mean [train]?");
  EXPECT_ERROR(
      qt_config_apply_override(c, "optim.lr=fast", err),
      "config: override 'optim.lr=fast': [optim] lr: expected a finite number in [0, 10], found 'fast'");
  EXPECT_ERROR(qt_config_apply_override(c, "data.path=a ;b", err),
               "[data] path: expected a string without ';'");
  EXPECT_ERROR(qt_config_set(c, "train", "epochs", "100001", err),
               "config: set: [train] epochs: expected an integer in [1, 100000], found '100001'");
  EXPECT_ERROR(qt_config_set(c, "data", "path", "two\nlines", err), "expected a single-line string");

  /* Nothing above changed anything. */
  for (int i = 0; i < TEST_SCHEMA_N; i++) {
    const char *origin = qt_config_origin(c, test_schema[i].section, test_schema[i].key);
    if (strcmp(origin, "default") != 0)
      qt_test_fail("[%s] %s changed by a failed load (origin %s)", test_schema[i].section, test_schema[i].key,
                   origin);
  }
  QT_CHECK(qt_config_int(c, "train", "epochs") == 4);
  QT_CHECK(qt_config_float(c, "optim", "lr") == 0.05);

  /* A file whose last line fails leaves the earlier good lines unapplied too. */
  EXPECT_ERROR(load_text(c, "partial.ini", "[train]\nepochs = 7\nbatch_size = 0\n", err), "partial.ini:3");
  QT_CHECK(qt_config_int(c, "train", "epochs") == 4);

  qt_config_free(c);

  { /* --values: a list too long to hold is refused, not cut; one of 200 names is whole */
    static char list[70000], *argv[3] = {"prog", "--values", list};
    static qt_cli_data_options d;
    memset(list, 'a', sizeof list - 1);
    int i = 1;
    QT_CHECK(qt_cli_data_option("prog", "--values --write-outputs", 3, argv, &i, &d) == -1);
    list[0] = 0;
    for (int k = 0; k < 200; k++) snprintf(list + strlen(list), 64, "%sblock.%d.relu.fq.quantize", k ? "," : "", k);
    i = 1;
    d.outputs_path = "out.h5";
    QT_CHECK(qt_cli_data_option("prog", "--values --write-outputs", 3, argv, &i, &d) == 1);
    QT_CHECK(qt_cli_data_finish("prog", &d) == 0 && d.n_names == 200);
    QT_CHECK(strcmp(d.names[199], "block.199.relu.fq.quantize") == 0);
  }
  return qt_test_finish();
}
