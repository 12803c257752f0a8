/* Programming errors abort with a message naming the key: a getter for a key not in the schema,
 * a getter of the wrong type, an int that does not fit, a schema with an invalid default or a
 * duplicate row. Each case runs in a forked child; the parent checks SIGABRT and stderr. */
#include "schema.h"
#include "tests/common/testutil.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

typedef void (*scenario)(void);

static void expect_abort(const char *label, scenario run, const char *want) {
  int fds[2];
  if (pipe(fds) != 0) {
    qt_test_fail("%s: pipe failed", label);
    return;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    run();
    _exit(0); /* reached only if nothing aborted */
  }
  close(fds[1]);
  char out[4096];
  size_t len = 0;
  ssize_t got;
  while (len < sizeof out - 1 && (got = read(fds[0], out + len, sizeof out - 1 - len)) > 0)
    len += (size_t)got;
  out[len] = '\0';
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT))
    qt_test_fail("%s: did not abort (status %d)", label, status);
  if (!strstr(out, want)) qt_test_fail("%s: stderr\n    %s\n  lacks '%s'", label, out, want);
  if (!strstr(out, "config.c:")) qt_test_fail("%s: stderr '%s' lacks file:line", label, out);
}

static qt_config *make(void) { return qt_config_create(test_schema, TEST_SCHEMA_N); }
static void unknown_key(void) { qt_config_int(make(), "train", "epochz"); }
static void unknown_section(void) { qt_config_string(make(), "model", "path"); }
static void wrong_type(void) { qt_config_int(make(), "optim", "lr"); }
static void enum_of_string(void) { qt_config_enum(make(), "data", "path"); }
static void too_big_for_int(void) { qt_config_int(make(), "train", "max_images"); }
static void unknown_origin(void) { qt_config_origin(make(), "train", "nope"); }
static void bad_default(void) {
  static const qt_cfg_key s[] = {{"train", "epochs", QT_CFG_INT, "0", 1, 10, NULL, NULL}};
  qt_config_create(s, 1);
}
static void duplicate_row(void) {
  static const qt_cfg_key s[] = {{"a", "k", QT_CFG_BOOL, "true", 0, 0, NULL, NULL},
                                 {"a", "k", QT_CFG_BOOL, "true", 0, 0, NULL, NULL}};
  qt_config_create(s, 2);
}
static void enum_without_choices(void) {
  static const qt_cfg_key s[] = {{"a", "k", QT_CFG_ENUM, "x", 0, 0, NULL, NULL}};
  qt_config_create(s, 1);
}
static void bad_name(void) {
  static const qt_cfg_key s[] = {{"a.b", "k", QT_CFG_BOOL, "true", 0, 0, NULL, NULL}};
  qt_config_create(s, 1);
}

int main(void) {
  expect_abort("unknown key", unknown_key, "[train] epochz is not in the config schema");
  expect_abort("unknown section", unknown_section, "[model] path is not in the config schema");
  expect_abort("wrong type", wrong_type, "[optim] lr has type float, not integer");
  expect_abort("enum of a string", enum_of_string, "[data] path has type string, not enum");
  expect_abort("int overflow", too_big_for_int, "use qt_config_int64");
  expect_abort("origin of unknown key", unknown_origin, "[train] nope is not in the config schema");
  expect_abort("bad default", bad_default,
               "row 0 ([train] epochs): invalid default: expected an integer in [1, 10], found '0'");
  expect_abort("duplicate row", duplicate_row, "row 1: duplicate key [a] k");
  expect_abort("enum without choices", enum_without_choices, "ENUM needs choices");
  expect_abort("bad name", bad_name, "section 'a.b'");
  return qt_test_finish();
}
