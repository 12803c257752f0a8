/* Schema-driven INI configuration (the programs' config files, backend descriptions).
 *
 * A program describes every key it understands in a table of qt_cfg_key rows (section, key,
 * type, default, range or choices, help); adding a key is adding a row. A qt_config holds, for
 * every row, the current value and where it came from (default, file:line, override). Values
 * are layered: defaults, then INI files, then "section.key=value" overrides from the command
 * line. Every value is validated when it is set, so the getters cannot fail; asking for a key
 * that is not in the schema, or with the wrong type, is a programming error and aborts.
 *
 * INI dialect (parsed with libinih): `[section]` headers, `key = value` (or `key: value`),
 * whole-line comments starting with ';' or '#', inline comments starting with ' ;'.
 * Indentation is ignored (no multi-line values). Lines are limited to 197 characters.
 * Booleans: true/false, 1/0, yes/no, on/off (any case). Enum values match their choices in
 * any case. Every error message starts with "config: " and names the file and line (or the
 * override), the section and key, what was expected and what was found. */
#ifndef QT_CONFIG_H
#define QT_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

typedef enum { QT_CFG_INT, QT_CFG_FLOAT, QT_CFG_BOOL, QT_CFG_STRING, QT_CFG_ENUM, QT_CFG_TYPE_COUNT } qt_cfg_type;

/* One schema row. section and key: 1..48 characters of [A-Za-z0-9_-].
 * INT and FLOAT values must lie in [min, max]; min == max == 0 means unbounded; -INFINITY or
 * INFINITY make one side open. choices: "a|b|c" for ENUM, NULL otherwise. default_value must
 * be valid for the row (checked by qt_config_create). help: one sentence, may be NULL. */
typedef struct {
  const char *section, *key;
  qt_cfg_type type;
  const char *default_value;
  double min, max;
  const char *choices;
  const char *help;
} qt_cfg_key;

typedef struct qt_config qt_config; /* opaque */

/* Every key starts at its default. The rows are copied; the strings they point to are not
 * and must outlive the config (string literals, normally). A malformed schema (bad name,
 * duplicate key, invalid default, ENUM without choices) aborts naming the row; returns NULL
 * only when memory runs out. */
qt_config *qt_config_create(const qt_cfg_key *schema, int n_keys);
void qt_config_free(qt_config *c);

/* Loads an INI file on top of the current values. All or nothing: on any error nothing
 * changes, -1 is returned and err (QT_ERR_LEN bytes, may be NULL) receives the first error,
 * e.g. "config: cannot open 'x.ini': No such file or directory",
 * "config: x.ini:7: syntax error: ...", "config: x.ini:3: unknown section [trian] ...",
 * "config: x.ini:5: unknown key 'epoch' in section [train]; did you mean 'epochs'?",
 * "config: x.ini:5: [train] epochs: expected an integer in [1, 100000], found 'ten'",
 * "config: x.ini:9: duplicate key 'lr' in section [optim] (first set at x.ini:4)".
 * A key may appear once per load; a later load or override replaces it. */
int qt_config_load_file(qt_config *c, const char *path, char *err);
/* Same for INI text in memory (e.g. stored in a checkpoint); origin names it in messages
 * and origins ("checkpoint.bin" -> "checkpoint.bin:12"); NULL means "<string>". */
int qt_config_load_string(qt_config *c, const char *text, const char *origin, char *err);

/* Applies one command-line override "section.key=value" (spaces around '=' are trimmed).
 * Errors: missing '=', missing "section.", unknown section or key (with a suggestion), or a
 * bad value; the config is unchanged on error. */
int qt_config_apply_override(qt_config *c, const char *arg, char *err);

/* Sets one key from program code (surrounding whitespace trimmed), validated like a file
 * value; origin "set". */
int qt_config_set(qt_config *c, const char *section, const char *key, const char *value, char *err);

/* Typed getters. The key must be in the schema with the matching type, else abort.
 * qt_config_int aborts if the value does not fit an int (use qt_config_int64).
 * qt_config_string works for STRING and ENUM keys; the pointer stays valid until the key is
 * changed or the config freed. qt_config_enum returns the index of the value in choices. */
int qt_config_int(const qt_config *c, const char *section, const char *key);
int64_t qt_config_int64(const qt_config *c, const char *section, const char *key);
double qt_config_float(const qt_config *c, const char *section, const char *key);
int qt_config_bool(const qt_config *c, const char *section, const char *key);
const char *qt_config_string(const qt_config *c, const char *section, const char *key);
int qt_config_enum(const qt_config *c, const char *section, const char *key);
/* The current value of any key as text (as it would be written to an INI file). */
const char *qt_config_value(const qt_config *c, const char *section, const char *key);
/* Where the current value came from: "default", "<file>:<line>", "override" or "set". */
const char *qt_config_origin(const qt_config *c, const char *section, const char *key);

/* Writes the resolved configuration: every key of every section, in schema order, with its
 * help, expected values and origin as comments. Loading the output gives identical values.
 * Returns 0, or -1 if writing failed. */
int qt_config_write_ini(const qt_config *c, FILE *f);
/* The same text in a malloc'd string (for checkpoints); NULL when memory runs out. */
char *qt_config_to_ini_string(const qt_config *c);

/* Command-line option values: parses s as a whole decimal integer in [lo, hi] into *out;
 * otherwise prints "<prog>: <opt> expects an integer in [lo, hi], found '<s>'" to stderr and
 * returns -1. */
int qt_cli_parse_int(const char *prog, const char *opt, const char *s, long lo, long hi, int *out);
/* The options every program that reads a model file and a data set shares: --config CFG.ini,
 * --images N (0 = all), --batch N, --write-outputs OUT.h5, --values NAME,NAME... */
typedef struct {
  const char *config_path, *outputs_path; /* NULL when not given */
  int images, batch;
  char values[65536];      /* --values as given */
  const char *names[2048]; /* --values split by qt_cli_data_finish */
  int n_names;
} qt_cli_data_options;
/* Consumes argv[*i] (advancing *i past its value) when it is one of the options above that
 * `accepted` lists (e.g. "--config --images"): 1 consumed, 0 not one of them, -1 after printing
 * a bad value's message to stderr. */
int qt_cli_data_option(const char *prog, const char *accepted, int argc, char **argv, int *i, qt_cli_data_options *d);

/* After the options are read: splits --values (in place) into d->names; -1 after printing
 * "<prog>: ..." to stderr when names are given without --write-outputs or there are more than
 * 64 of them. */
int qt_cli_data_finish(const char *prog, qt_cli_data_options *d);

#endif
