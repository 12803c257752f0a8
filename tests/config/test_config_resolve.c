/* A valid file and overrides resolve to the right typed values with the right origins:
 * defaults, then files in order, then overrides; INI dialect details (comments, inline
 * comments, indentation, CRLF, BOM, "key: value", case of booleans and enums). */
#include "schema.h"
#include "tests/common/testutil.h"

#define CHECK_ORIGIN(c, s, k, want)                                                                          \
  do {                                                                                                       \
    const char *o_ = qt_config_origin((c), (s), (k));                                                        \
    if (strcmp(o_, (want)) != 0)                                                                             \
      qt_test_fail("%s:%d: origin of [%s] %s is '%s', want '%s'", __FILE__, __LINE__, (s), (k), o_, (want)); \
  } while (0)

/* Each override of the NULL-terminated list must be accepted. */
static void expect_overrides(qt_config *c, const char *const *overrides) {
  char err[QT_ERR_LEN];
  for (; *overrides; overrides++)
    if (qt_config_apply_override(c, *overrides, err) != 0) qt_test_fail("override '%s' refused: %s", *overrides, err);
}

int main(void) {
  char err[QT_ERR_LEN] = "";
  qt_config *c = qt_config_create(test_schema, TEST_SCHEMA_N);

  /* Defaults. */
  QT_CHECK(qt_config_int(c, "train", "epochs") == 4);
  QT_CHECK(qt_config_int64(c, "train", "max_images") == 10000000000LL);
  QT_CHECK(qt_config_bool(c, "train", "augment") == 0);
  QT_CHECK(strcmp(qt_config_string(c, "train", "checkpoint"), "") == 0);
  QT_CHECK(strcmp(qt_config_string(c, "optim", "kind"), "sgd") == 0 &&
           qt_config_enum(c, "optim", "kind") == 0);
  QT_CHECK(qt_config_float(c, "optim", "weight_decay") == 5e-4);
  QT_CHECK(qt_config_enum(c, "schedule", "kind") == 2);
  CHECK_ORIGIN(c, "train", "epochs", "default");

  const char *file =
      "\xEF\xBB\xBF; FashionCNN recipe\r\n"
      "# hash comments too\r\n"
      "[train]\r\n"
      "  epochs = 12      ; inline comment\r\n"
      "\tbatch_size: 256\r\n"
      "augment = Yes\r\n"
      "seed = -7\r\n"
      "checkpoint = runs/a b/ckpt#1.bin\r\n"
      "\r\n"
      "[optim]\r\n"
      "kind = AdamW\r\n"
      "lr = 1e-3\r\n"
      "  [schedule]\r\n"
      "kind = linear\r\n";
  write_file("resolve.ini", file);
  QT_CHECK(qt_config_load_file(c, "resolve.ini", err) == 0);
  if (err[0]) qt_test_fail("unexpected error: %s", err);
  QT_CHECK(qt_config_int(c, "train", "epochs") == 12);
  QT_CHECK(qt_config_int(c, "train", "batch_size") == 256);
  QT_CHECK(qt_config_bool(c, "train", "augment") == 1);
  QT_CHECK(qt_config_int(c, "train", "seed") == -7);
  QT_CHECK(strcmp(qt_config_string(c, "train", "checkpoint"), "runs/a b/ckpt#1.bin") == 0);
  QT_CHECK(strcmp(qt_config_string(c, "optim", "kind"), "adamw") == 0 &&
           qt_config_enum(c, "optim", "kind") == 1);
  QT_CHECK(qt_config_float(c, "optim", "lr") == 1e-3);
  QT_CHECK(strcmp(qt_config_string(c, "schedule", "kind"), "linear") == 0);
  CHECK_ORIGIN(c, "train", "epochs", "resolve.ini:4");
  CHECK_ORIGIN(c, "train", "batch_size", "resolve.ini:5");
  CHECK_ORIGIN(c, "optim", "lr", "resolve.ini:12");
  CHECK_ORIGIN(c, "schedule", "kind", "resolve.ini:14");
  CHECK_ORIGIN(c, "optim", "momentum", "default");

  /* A second file replaces only what it names. */
  QT_CHECK(qt_config_load_string(c, "[optim]\nlr = 0.2\n[train]\naugment = off\n", "second.ini", err) == 0);
  QT_CHECK(qt_config_float(c, "optim", "lr") == 0.2);
  QT_CHECK(qt_config_bool(c, "train", "augment") == 0);
  QT_CHECK(qt_config_int(c, "train", "epochs") == 12);
  CHECK_ORIGIN(c, "optim", "lr", "second.ini:2");

  /* Overrides win over files; spaces around '=' are trimmed. */
  const char *const overrides[] = {"train.epochs=3",
                                   "optim.lr = 0.125",
                                   "train.augment=1",
                                   "train.checkpoint=",
                                   "train.max_images=9000000000000",
                                   "schedule.warmup_steps=+10",
                                   "data.path=/data/x=y.h5", /* '=' inside the value */
                                   NULL};
  expect_overrides(c, overrides);
  QT_CHECK(qt_config_int(c, "train", "epochs") == 3);
  QT_CHECK(qt_config_float(c, "optim", "lr") == 0.125);
  QT_CHECK(qt_config_bool(c, "train", "augment") == 1);
  QT_CHECK(strcmp(qt_config_string(c, "train", "checkpoint"), "") == 0);
  QT_CHECK(qt_config_int64(c, "train", "max_images") == 9000000000000LL);
  QT_CHECK(qt_config_int(c, "schedule", "warmup_steps") == 10);
  QT_CHECK(strcmp(qt_config_string(c, "data", "path"), "/data/x=y.h5") == 0);
  CHECK_ORIGIN(c, "train", "epochs", "override");

  /* Program-side set. */
  QT_CHECK(qt_config_set(c, "optim", "momentum", "0.95", err) == 0);
  QT_CHECK(qt_config_float(c, "optim", "momentum") == 0.95);
  CHECK_ORIGIN(c, "optim", "momentum", "set");

  /* Boundary values of ranges are accepted. */
  const char *const bounds[] = {"train.epochs=100000", "optim.lr=0", "optim.lr=10", "optim.shift=0", NULL};
  expect_overrides(c, bounds);
  QT_CHECK(qt_config_int(c, "train", "epochs") == 100000);

  /* An empty file changes nothing. */
  QT_CHECK(qt_config_load_string(c, "", "empty.ini", err) == 0);
  QT_CHECK(qt_config_load_string(c, "; only a comment\n\n", "empty.ini", err) == 0);

  remove("resolve.ini");
  qt_config_free(c);
  return qt_test_finish();
}
