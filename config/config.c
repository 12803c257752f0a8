/* Schema-driven INI configuration: validation, layering, origins and error messages.
 *
 * libinih does the INI tokenizing. We feed it lines through our own reader, which counts
 * lines, rejects lines too long for inih's fixed buffer (it would silently split them),
 * strips indentation (so an indented key is never taken for a multi-line continuation) and
 * checks section headers (inih does not report empty sections). A load is staged and
 * committed only when the whole text is valid. */
#include "config/config.h"
#include "base/base.h"

/* Debian's libinih 55 is built with INI_HANDLER_LINENO (its parser passes the line number as a
 * 5th handler argument; checked by disassembly), so our handler type must match. We count lines
 * ourselves in the reader and do not rely on the argument. */
#define INI_HANDLER_LINENO 1
#include <ini.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAME 48  /* inih truncates section and key names at 49 characters */
#define MAX_LINE 197 /* inih's line buffer is 200 bytes: text + '\r' '\n' '\0' */

typedef struct {
  char *value;  /* canonical text, always valid for the row */
  char *origin; /* "default", "<file>:<line>", "override", "set" */
} slot;

struct qt_config {
  qt_cfg_key *schema; /* (n) rows, copied */
  slot *slots;        /* (n) */
  int n;
};

static const char *const type_names[] = {"integer", "float", "bool", "string", "enum"};
_Static_assert(sizeof type_names / sizeof type_names[0] == QT_CFG_TYPE_COUNT, "config type name table");

#define PANIC(...) qt_panic(__FILE__, __LINE__, __VA_ARGS__)

static char *copy_string(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static char *format_string(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format_string(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s) {
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  return s;
}

/* Appends printf output to buf (size len), truncating safely. */
static void append(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t len, const char *fmt, ...) {
  size_t used = strlen(buf);
  if (used + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, len - used, fmt, ap);
  va_end(ap);
}

/* ---------------------------------------------------------------- values */

/* Integers as integers, else the shortest %g form that reads back as the same double. */
static void format_number(char *buf, size_t len, double x) {
  if (x == floor(x) && fabs(x) < 1e15) {
    snprintf(buf, len, "%.0f", x);
    return;
  }
  for (int digits = 1; digits <= 17; digits++) {
    snprintf(buf, len, "%.*g", digits, x);
    if (strtod(buf, NULL) == x) return;
  }
}

/* "in [1, 100000]", ">= 0", "<= 5" or "" (unbounded); bounds already normalized. */
static void describe_range(char *buf, size_t len, const qt_cfg_key *k) {
  char lo[32], hi[32];
  format_number(lo, sizeof lo, k->min);
  format_number(hi, sizeof hi, k->max);
  if (isinf(k->min) && isinf(k->max))
    buf[0] = '\0';
  else if (isinf(k->min))
    snprintf(buf, len, " <= %s", hi);
  else if (isinf(k->max))
    snprintf(buf, len, " >= %s", lo);
  else
    snprintf(buf, len, " in [%s, %s]", lo, hi);
}

/* What a row accepts, e.g. "an integer in [1, 100000]", "one of 'sgd', 'adamw'". */
static void describe_expected(char *buf, size_t len, const qt_cfg_key *k) {
  char range[80];
  buf[0] = '\0';
  switch (k->type) {
    case QT_CFG_INT:
      describe_range(range, sizeof range, k);
      snprintf(buf, len, "an integer%s", range);
      break;
    case QT_CFG_FLOAT:
      describe_range(range, sizeof range, k);
      snprintf(buf, len, "a finite number%s", range);
      break;
    case QT_CFG_BOOL: snprintf(buf, len, "a boolean (true/false, yes/no, on/off, 1/0)"); break;
    case QT_CFG_STRING: snprintf(buf, len, "a single-line string"); break;
    case QT_CFG_ENUM: {
      snprintf(buf, len, "one of ");
      const char *p = k->choices;
      while (*p) {
        size_t n = strcspn(p, "|");
        append(buf, len, "%s'%.*s'", p == k->choices ? "" : ", ", (int)n, p);
        p += n;
        if (*p == '|') p++;
      }
      break;
    }
    default: break;
  }
}

static int equal_nocase(const char *a, const char *b, size_t bn) {
  size_t i = 0;
  for (; i < bn && a[i]; i++)
    if (tolower((unsigned char)a[i]) != tolower((unsigned char)b[i])) return 0;
  return i == bn && a[i] == '\0';
}

static const char *const true_words[] = {"true", "yes", "on", "1"};
static const char *const false_words[] = {"false", "no", "off", "0"};

static char *or_out_of_memory(char *value, char *why, size_t why_len) {
  if (!value) snprintf(why, why_len, "out of memory");
  return value;
}

/* Validates text (already trimmed) for row k. Returns the canonical value (malloc'd) or
 * NULL with why = "expected ..., found '...'" (or "out of memory"). */
static char *validate(const qt_cfg_key *k, const char *text, char *why, size_t why_len) {
  char expected[QT_ERR_LEN / 2];
  describe_expected(expected, sizeof expected, k);
  switch (k->type) {
    case QT_CFG_INT: {
      char *end;
      errno = 0;
      long long v = strtoll(text, &end, 10);
      if (*text == '\0' || *end != '\0' || errno == ERANGE || (double)v < k->min || (double)v > k->max) break;
      return or_out_of_memory(format_string("%lld", v), why, why_len);
    }
    case QT_CFG_FLOAT: {
      char *end;
      double v = strtod(text, &end);
      if (*text == '\0' || *end != '\0' || !isfinite(v) || v < k->min || v > k->max) break;
      /* Kept as written: it reads back as the same double. */
      return or_out_of_memory(copy_string(text), why, why_len);
    }
    case QT_CFG_BOOL:
      for (int i = 0; i < 4; i++) {
        if (equal_nocase(text, true_words[i], strlen(true_words[i])))
          return or_out_of_memory(copy_string("true"), why, why_len);
        if (equal_nocase(text, false_words[i], strlen(false_words[i])))
          return or_out_of_memory(copy_string("false"), why, why_len);
      }
      break;
    case QT_CFG_ENUM: {
      const char *p = k->choices;
      while (*p) {
        size_t n = strcspn(p, "|");
        if (equal_nocase(text, p, n)) return or_out_of_memory(format_string("%.*s", (int)n, p), why, why_len);
        p += n;
        if (*p == '|') p++;
      }
      break;
    }
    case QT_CFG_STRING: {
      /* Must survive a write_ini/load round trip: one line, no inline comment, fits a line. */
      for (const char *p = text; *p; p++) {
        if (iscntrl((unsigned char)*p)) {
          snprintf(why, why_len,
                   "expected a single-line string without control characters, found character 0x%02x at position %d",
                   (unsigned char)*p, (int)(p - text) + 1);
          return NULL;
        }
        if (*p == ';' && (p == text || isspace((unsigned char)p[-1]))) {
          snprintf(why, why_len,
                   "expected a string without ';' at its start or after a space (an INI comment), found '%.60s'", text);
          return NULL;
        }
      }
      if (strlen(k->key) + 3 + strlen(text) > MAX_LINE) {
        snprintf(why, why_len, "expected a string of at most %d characters, found %zu characters",
                 (int)(MAX_LINE - 3 - strlen(k->key)), strlen(text));
        return NULL;
      }
      return or_out_of_memory(copy_string(text), why, why_len);
    }
    default: break;
  }
  snprintf(why, why_len, "expected %s, found '%.80s%s'", expected, text, strlen(text) > 80 ? "..." : "");
  return NULL;
}

/* ---------------------------------------------------------------- names and suggestions */

static int find_key(const qt_config *c, const char *section, const char *key) {
  for (int i = 0; i < c->n; i++)
    if (strcmp(c->schema[i].section, section) == 0 && strcmp(c->schema[i].key, key) == 0) return i;
  return -1;
}

static int section_known(const qt_config *c, const char *section) {
  for (int i = 0; i < c->n; i++)
    if (strcmp(c->schema[i].section, section) == 0) return 1;
  return 0;
}

/* Is row i the first row of its section? (sections listed in schema order) */
static int first_of_section(const qt_config *c, int i) {
  for (int j = 0; j < i; j++)
    if (strcmp(c->schema[j].section, c->schema[i].section) == 0) return 0;
  return 1;
}

/* Case-insensitive Levenshtein distance; long names count as far apart. */
static int edit_distance(const char *a, const char *b) {
  enum { MAX = 64 };
  size_t na = strlen(a), nb = strlen(b);
  if (na > MAX || nb > MAX) return 1000;
  int prev[MAX + 1], cur[MAX + 1];
  for (size_t j = 0; j <= nb; j++) prev[j] = (int)j;
  for (size_t i = 1; i <= na; i++) {
    cur[0] = (int)i;
    for (size_t j = 1; j <= nb; j++) {
      int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
      int best = prev[j - 1] + cost;
      if (prev[j] + 1 < best) best = prev[j] + 1;
      if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
      cur[j] = best;
    }
    memcpy(prev, cur, (nb + 1) * sizeof prev[0]);
  }
  return prev[nb];
}

/* One edit for short names, one more per 4 characters ("trian" -> "train" is two). */
static int close_enough(const char *typed, int distance) { return distance <= 1 + (int)strlen(typed) / 4; }

/* "unknown section [trian]; did you mean [train]? (known sections: [train], [optim])" */
static void describe_unknown_section(char *buf, size_t len, const qt_config *c, const char *section) {
  const char *best = NULL;
  int best_d = 1000;
  for (int i = 0; i < c->n; i++) {
    int d = edit_distance(section, c->schema[i].section);
    if (d < best_d) best_d = d, best = c->schema[i].section;
  }
  append(buf, len, "unknown section [%.60s]", section);
  if (best && close_enough(section, best_d)) append(buf, len, "; did you mean [%s]?", best);
  append(buf, len, " (known sections:");
  for (int i = 0, first = 1; i < c->n; i++) {
    if (!first_of_section(c, i)) continue;
    append(buf, len, "%s [%s]", first ? "" : ",", c->schema[i].section);
    first = 0;
  }
  append(buf, len, ")");
}

/* "unknown key 'epoch' in section [train]; did you mean 'epochs'?" */
static void describe_unknown_key(char *buf, size_t len, const qt_config *c, const char *section, const char *key) {
  append(buf, len, "unknown key '%.60s' in section [%s]", key, section);
  for (int i = 0; i < c->n; i++) {
    if (strcmp(c->schema[i].key, key) == 0) {
      append(buf, len, "; '%s' belongs to section [%s]", key, c->schema[i].section);
      return;
    }
  }
  const char *best = NULL;
  int best_d = 1000;
  for (int i = 0; i < c->n; i++) {
    if (strcmp(c->schema[i].section, section) != 0) continue;
    int d = edit_distance(key, c->schema[i].key);
    if (d < best_d) best_d = d, best = c->schema[i].key;
  }
  if (best && close_enough(key, best_d)) {
    append(buf, len, "; did you mean '%s'?", best);
    return;
  }
  append(buf, len, " (known keys:");
  for (int i = 0, first = 1; i < c->n; i++) {
    if (strcmp(c->schema[i].section, section) != 0) continue;
    append(buf, len, "%s %s", first ? "" : ",", c->schema[i].key);
    first = 0;
  }
  append(buf, len, ")");
}

/* ---------------------------------------------------------------- create / free */

static int valid_name(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n < 1 || n > MAX_NAME) return 0;
  for (size_t i = 0; i < n; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-')) return 0;
  return 1;
}

static int valid_choices(const char *s) {
  if (!s || !*s) return 0;
  for (const char *p = s; *p; p++) {
    if (*p == '|' && (p == s || p[1] == '|' || p[1] == '\0')) return 0; /* empty choice */
    if (*p != '|' && !(isalnum((unsigned char)*p) || strchr("_-.+", *p))) return 0;
  }
  return 1;
}

qt_config *qt_config_create(const qt_cfg_key *schema, int n_keys) {
  if (n_keys < 0 || (n_keys > 0 && !schema))
    PANIC("qt_config_create: %d schema rows at %p", n_keys, (const void *)schema);
  qt_config *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->n = n_keys;
  c->schema = calloc((size_t)(n_keys ? n_keys : 1), sizeof *c->schema);
  c->slots = calloc((size_t)(n_keys ? n_keys : 1), sizeof *c->slots);
  if (!c->schema || !c->slots) {
    qt_config_free(c);
    return NULL;
  }
  for (int i = 0; i < n_keys; i++) {
    qt_cfg_key *k = &c->schema[i];
    *k = schema[i];
    if (!valid_name(k->section) || !valid_name(k->key))
      PANIC("config schema row %d: section '%s' / key '%s': expected 1..%d characters of [A-Za-z0-9_-]", i,
            k->section ? k->section : "(null)", k->key ? k->key : "(null)", MAX_NAME);
    if ((unsigned)k->type >= QT_CFG_TYPE_COUNT)
      PANIC("config schema row %d ([%s] %s): bad type %d", i, k->section, k->key, (int)k->type);
    if (k->type == QT_CFG_ENUM && !valid_choices(k->choices))
      PANIC("config schema row %d ([%s] %s): ENUM needs choices \"a|b|c\", found '%s'", i, k->section, k->key,
            k->choices ? k->choices : "(null)");
    if (k->min == 0 && k->max == 0) k->min = -INFINITY, k->max = INFINITY;
    if (!(k->min <= k->max))
      PANIC("config schema row %d ([%s] %s): min %g > max %g", i, k->section, k->key, k->min, k->max);
    if (find_key(c, k->section, k->key) >= 0 && find_key(c, k->section, k->key) < i)
      PANIC("config schema row %d: duplicate key [%s] %s", i, k->section, k->key);
    char why[QT_ERR_LEN];
    if (!k->default_value) PANIC("config schema row %d ([%s] %s): no default value", i, k->section, k->key);
    c->slots[i].value = validate(k, k->default_value, why, sizeof why);
    if (!c->slots[i].value && strcmp(why, "out of memory") != 0)
      PANIC("config schema row %d ([%s] %s): invalid default: %s", i, k->section, k->key, why);
    c->slots[i].origin = copy_string("default");
    if (!c->slots[i].value || !c->slots[i].origin) {
      qt_config_free(c);
      return NULL;
    }
  }
  return c;
}

void qt_config_free(qt_config *c) {
  if (!c) return;
  if (c->slots) {
    for (int i = 0; i < c->n; i++) {
      free(c->slots[i].value);
      free(c->slots[i].origin);
    }
  }
  QT_FREE_ALL(c->slots, c->schema, c);
}

/* Replaces slot i's value and origin (both malloc'd, owned from here on). */
static void slot_replace(qt_config *c, int i, char *value, char *origin) {
  free(c->slots[i].value);
  free(c->slots[i].origin);
  c->slots[i].value = value;
  c->slots[i].origin = origin;
}

/* ---------------------------------------------------------------- loading INI text */

typedef struct {
  qt_config *c;
  const char *origin; /* file name for messages */
  const char *text;   /* the whole INI text */
  size_t pos;         /* reader position in text */
  int line;           /* lines handed to inih so far = current line number */
  int err_line;       /* line of the first error found by the reader or the handler, 0 = none */
  char err[QT_ERR_LEN];
  char **staged;    /* (n) canonical values from this load, or NULL */
  int *staged_line; /* (n) line that set them, 0 = not set */
  int out_of_memory;
} load_ctx;

static void load_error(load_ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void load_error(load_ctx *x, const char *fmt, ...) {
  if (x->err_line) return; /* keep the first */
  x->err_line = x->line;
  snprintf(x->err, sizeof x->err, "config: %s:%d: ", x->origin, x->line);
  va_list ap;
  va_start(ap, fmt);
  size_t used = strlen(x->err);
  vsnprintf(x->err + used, sizeof x->err - used, fmt, ap);
  va_end(ap);
}

/* inih reader: hands out one line per call with indentation removed, checks its length and,
 * for a section header, that the section is in the schema. */
static char *read_line(char *str, int num, void *stream) {
  load_ctx *x = stream;
  const char *s = x->text + x->pos;
  if (*s == '\0') return NULL;
  size_t len = strcspn(s, "\n");
  const int has_newline = s[len] == '\n';
  x->pos += len + has_newline;
  x->line++;
  if (x->line == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) s += 3, len -= 3; /* UTF-8 BOM */
  while (len && isspace((unsigned char)*s)) s++, len--;
  size_t content = len;
  while (content && isspace((unsigned char)s[content - 1])) content--;
  const int limit = num - 3 < MAX_LINE ? num - 3 : MAX_LINE;
  if ((int)content > limit) {
    load_error(x, "line is %zu characters long; at most %d are supported", content, limit);
    snprintf(str, (size_t)num, "\n");
    return str;
  }
  snprintf(str, (size_t)num, "%.*s\n", (int)content, s);
  if (str[0] == '[') {
    /* Same rule as inih: the name ends at the first ']' that is not inside an inline comment. */
    const char *end = str + 1;
    while (*end && *end != ']' && !(*end == ';' && isspace((unsigned char)end[-1]))) end++;
    if (*end == ']') {
      char name[QT_ERR_LEN / 4];
      snprintf(name, sizeof name, "%.*s", (int)(end - str - 1), str + 1);
      if (!section_known(x->c, name)) {
        char msg[QT_ERR_LEN];
        msg[0] = '\0';
        describe_unknown_section(msg, sizeof msg, x->c, name);
        load_error(x, "%s", msg);
      }
    }
  }
  return str;
}

static int on_key(void *user, const char *section, const char *name, const char *value, int lineno) {
  load_ctx *x = user;
  (void)lineno;              /* equals x->line; see the note at #include <ini.h> */
  if (x->err_line) return 1; /* report the first error only */
  if (!*section) {
    load_error(x, "key '%.60s' is outside any section (put it under a [section] header)", name);
    return 0;
  }
  if (!section_known(x->c, section)) return 1; /* the reader reported the header */
  const int k = find_key(x->c, section, name);
  if (k < 0) {
    char msg[QT_ERR_LEN];
    msg[0] = '\0';
    describe_unknown_key(msg, sizeof msg, x->c, section, name);
    load_error(x, "%s", msg);
    return 0;
  }
  if (x->staged_line[k]) {
    load_error(x, "duplicate key '%s' in section [%s] (first set at %s:%d)", name, section, x->origin,
               x->staged_line[k]);
    return 0;
  }
  char why[QT_ERR_LEN];
  char *canon = validate(&x->c->schema[k], value, why, sizeof why);
  if (!canon) {
    load_error(x, "[%s] %s: %s", section, name, why);
    return 0;
  }
  x->staged[k] = canon;
  x->staged_line[k] = x->line;
  return 1;
}

/* The text of line `line` (1-based) of text, trimmed, for messages. */
static void line_text(char *buf, size_t len, const char *text, int line) {
  const char *s = text;
  for (int i = 1; i < line && *s; i++) {
    s += strcspn(s, "\n");
    if (*s) s++;
  }
  size_t n = strcspn(s, "\n");
  while (n && isspace((unsigned char)*s)) s++, n--;
  while (n && isspace((unsigned char)s[n - 1])) n--;
  snprintf(buf, len, "%.*s%s", n > 60 ? 60 : (int)n, s, n > 60 ? "..." : "");
}

int qt_config_load_string(qt_config *c, const char *text, const char *origin, char *err) {
  if (!text) PANIC("qt_config_load_string: NULL text");
  load_ctx x = {.c = c, .origin = origin ? origin : "<string>", .text = text};
  x.staged = calloc((size_t)(c->n ? c->n : 1), sizeof *x.staged);
  x.staged_line = calloc((size_t)(c->n ? c->n : 1), sizeof *x.staged_line);
  char **origins = calloc((size_t)(c->n ? c->n : 1), sizeof *origins);
  int rc = -1;
  if (!x.staged || !x.staged_line || !origins) {
    qt_err(err, "config: %s: out of memory", x.origin);
    goto done;
  }
  const int parse = ini_parse_stream(read_line, &x, on_key, &x);
  if (parse == -2) {
    qt_err(err, "config: %s: out of memory", x.origin);
    goto done;
  }
  if (parse > 0 && (x.err_line == 0 || parse < x.err_line)) {
    char found[80];
    line_text(found, sizeof found, text, parse);
    if (found[0] == '[')
      qt_err(err, "config: %s:%d: syntax error: expected ']' to close the section header, found '%s'", x.origin, parse,
             found);
    else
      qt_err(err, "config: %s:%d: syntax error: expected '[section]', 'key = value' or a comment, found '%s'", x.origin,
             parse, found);
    goto done;
  }
  if (x.err_line) {
    qt_err(err, "%s", x.err);
    goto done;
  }
  for (int i = 0; i < c->n; i++) {
    if (!x.staged[i]) continue;
    origins[i] = format_string("%s:%d", x.origin, x.staged_line[i]);
    if (!origins[i]) {
      qt_err(err, "config: %s: out of memory", x.origin);
      goto done;
    }
  }
  for (int i = 0; i < c->n; i++) {
    if (!x.staged[i]) continue;
    slot_replace(c, i, x.staged[i], origins[i]);
    x.staged[i] = origins[i] = NULL;
  }
  rc = 0;
done:
  for (int i = 0; i < c->n; i++) {
    if (x.staged) free(x.staged[i]);
    if (origins) free(origins[i]);
  }
  QT_FREE_ALL(x.staged, x.staged_line, origins);
  return rc;
}

int qt_config_load_file(qt_config *c, const char *path, char *err) {
  FILE *f = fopen(path, "rb");
  if (!f) return qt_err(err, "config: cannot open '%s': %s", path, strerror(errno));
  size_t cap = 4096, len = 0;
  char *text = malloc(cap);
  while (text) {
    if (len + 1 == cap) {
      char *bigger = realloc(text, cap * 2);
      if (!bigger) {
        free(text);
        text = NULL;
        break;
      }
      text = bigger;
      cap *= 2;
    }
    size_t got = fread(text + len, 1, cap - 1 - len, f);
    len += got;
    if (got == 0) break;
  }
  if (!text) {
    fclose(f);
    return qt_err(err, "config: cannot read '%s': out of memory", path);
  }
  if (ferror(f)) {
    int e = errno;
    fclose(f);
    free(text);
    return qt_err(err, "config: cannot read '%s': %s", path, strerror(e));
  }
  fclose(f);
  text[len] = '\0';
  if (strlen(text) != len) {
    free(text);
    return qt_err(err, "config: '%s' contains a NUL byte: expected an INI text file", path);
  }
  int rc = qt_config_load_string(c, text, path, err);
  free(text);
  return rc;
}

/* ---------------------------------------------------------------- set / override */

/* Validates and stores one value; `where` prefixes messages ("set", "override '...'"). */
static int set_value(qt_config *c, const char *where, const char *section, const char *key, const char *value,
                     const char *origin, char *err) {
  char msg[QT_ERR_LEN];
  msg[0] = '\0';
  if (!section_known(c, section)) {
    describe_unknown_section(msg, sizeof msg, c, section);
    return qt_err(err, "config: %s: %s", where, msg);
  }
  const int k = find_key(c, section, key);
  if (k < 0) {
    describe_unknown_key(msg, sizeof msg, c, section, key);
    return qt_err(err, "config: %s: %s", where, msg);
  }
  char *canon = validate(&c->schema[k], value, msg, sizeof msg);
  if (!canon) return qt_err(err, "config: %s: [%s] %s: %s", where, section, key, msg);
  char *org = copy_string(origin);
  if (!org) {
    free(canon);
    return qt_err(err, "config: %s: out of memory", where);
  }
  slot_replace(c, k, canon, org);
  return 0;
}

/* Copies s[0..n) into buf with surrounding whitespace removed. */
static void trimmed(char *buf, size_t len, const char *s, size_t n) {
  while (n && isspace((unsigned char)*s)) s++, n--;
  while (n && isspace((unsigned char)s[n - 1])) n--;
  snprintf(buf, len, "%.*s", (int)n, s);
}

int qt_config_set(qt_config *c, const char *section, const char *key, const char *value, char *err) {
  char v[QT_ERR_LEN];
  if (!section || !key || !value) PANIC("qt_config_set: NULL section, key or value");
  trimmed(v, sizeof v, value, strlen(value));
  return set_value(c, "set", section, key, v, "set", err);
}

int qt_config_apply_override(qt_config *c, const char *arg, char *err) {
  char where[QT_ERR_LEN / 4];
  snprintf(where, sizeof where, "override '%.80s%s'", arg, strlen(arg) > 80 ? "..." : "");
  const char *eq = strchr(arg, '=');
  if (!eq) return qt_err(err, "config: %s: expected section.key=value, found no '='", where);
  char lhs[QT_ERR_LEN / 4], value[QT_ERR_LEN];
  /* never cut a value or a name: "train.epochs=0...0100001" must not become another number */
  if ((size_t)(eq - arg) >= sizeof lhs || strlen(eq + 1) >= sizeof value)
    return qt_err(err, "config: %s: longer than %zu characters (name) or %zu (value)", where, sizeof lhs - 1,
                  sizeof value - 1);
  trimmed(lhs, sizeof lhs, arg, (size_t)(eq - arg));
  trimmed(value, sizeof value, eq + 1, strlen(eq + 1));
  char *dot = strchr(lhs, '.');
  if (!dot) {
    char hint[QT_ERR_LEN / 2] = "";
    for (int i = 0, matches = 0; i < c->n; i++) {
      if (strcmp(c->schema[i].key, lhs) != 0) continue;
      if (++matches == 1)
        snprintf(hint, sizeof hint, "; did you mean '%s.%s=%.60s'?", c->schema[i].section, lhs, value);
      else
        hint[0] = '\0'; /* ambiguous: no hint */
    }
    return qt_err(err, "config: %s: expected section.key=value, found no 'section.' before '%s'%s", where, lhs, hint);
  }
  *dot = '\0';
  return set_value(c, where, lhs, dot + 1, value, "override", err);
}

/* ---------------------------------------------------------------- getters */

static const slot *get(const qt_config *c, const char *fn, const char *section, const char *key, qt_cfg_type want,
                       qt_cfg_type also) {
  const int k = find_key(c, section, key);
  if (k < 0) PANIC("%s: key [%s] %s is not in the config schema", fn, section, key);
  const qt_cfg_type t = c->schema[k].type;
  if (t != want && t != also)
    PANIC("%s: key [%s] %s has type %s, not %s", fn, section, key, type_names[t], type_names[want]);
  return &c->slots[k];
}

int64_t qt_config_int64(const qt_config *c, const char *section, const char *key) {
  return strtoll(get(c, __func__, section, key, QT_CFG_INT, QT_CFG_INT)->value, NULL, 10);
}

int qt_config_int(const qt_config *c, const char *section, const char *key) {
  long long v = strtoll(get(c, __func__, section, key, QT_CFG_INT, QT_CFG_INT)->value, NULL, 10);
  if (v < -2147483647 - 1 || v > 2147483647)
    PANIC("qt_config_int: [%s] %s = %lld does not fit an int (use qt_config_int64)", section, key, v);
  return (int)v;
}

double qt_config_float(const qt_config *c, const char *section, const char *key) {
  return strtod(get(c, __func__, section, key, QT_CFG_FLOAT, QT_CFG_FLOAT)->value, NULL);
}

int qt_config_bool(const qt_config *c, const char *section, const char *key) {
  return strcmp(get(c, __func__, section, key, QT_CFG_BOOL, QT_CFG_BOOL)->value, "true") == 0;
}

const char *qt_config_string(const qt_config *c, const char *section, const char *key) {
  return get(c, __func__, section, key, QT_CFG_STRING, QT_CFG_ENUM)->value;
}

const char *qt_config_value(const qt_config *c, const char *section, const char *key) {
  const int k = find_key(c, section, key);
  if (k < 0) PANIC("qt_config_value: key [%s] %s is not in the config schema", section, key);
  return c->slots[k].value;
}

int qt_config_enum(const qt_config *c, const char *section, const char *key) {
  const char *v = get(c, __func__, section, key, QT_CFG_ENUM, QT_CFG_ENUM)->value;
  const char *p = c->schema[find_key(c, section, key)].choices;
  for (int index = 0; *p; index++) {
    size_t n = strcspn(p, "|");
    if (strlen(v) == n && strncmp(v, p, n) == 0) return index;
    p += n;
    if (*p == '|') p++;
  }
  PANIC("qt_config_enum: [%s] %s = '%s' is not among its choices", section, key, v);
}

const char *qt_config_origin(const qt_config *c, const char *section, const char *key) {
  const int k = find_key(c, section, key);
  if (k < 0) PANIC("qt_config_origin: key [%s] %s is not in the config schema", section, key);
  return c->slots[k].origin;
}

/* ---------------------------------------------------------------- writing */

/* Writes text as '; ' comment lines wrapped at about 90 columns (inih's line limit is 197). */
static void write_comment(FILE *f, const char *text) {
  const char *p = text;
  while (*p) {
    while (*p == ' ' || *p == '\n') p++;
    if (!*p) break;
    size_t n = strcspn(p, "\n");
    if (n > 88) {
      size_t cut = 88;
      while (cut > 20 && p[cut] != ' ') cut--;
      n = p[cut] == ' ' ? cut : 88;
    }
    fprintf(f, "; %.*s\n", (int)n, p);
    p += n;
  }
}

int qt_config_write_ini(const qt_config *c, FILE *f) {
  fprintf(f, "; Resolved configuration: every key, with its origin. Loadable as a config file.\n");
  for (int s = 0; s < c->n; s++) {
    if (!first_of_section(c, s)) continue;
    fprintf(f, "\n[%s]\n", c->schema[s].section);
    for (int i = s; i < c->n; i++) {
      const qt_cfg_key *k = &c->schema[i];
      if (strcmp(k->section, c->schema[s].section) != 0) continue;
      char expected[QT_ERR_LEN / 2], note[QT_ERR_LEN];
      describe_expected(expected, sizeof expected, k);
      if (i != s) fputc('\n', f);
      if (k->help && *k->help) write_comment(f, k->help);
      snprintf(note, sizeof note, "%s; default '%s'", expected, k->default_value);
      if (strcmp(c->slots[i].origin, "default") != 0) append(note, sizeof note, "; from %s", c->slots[i].origin);
      write_comment(f, note);
      fprintf(f, "%s =%s%s\n", k->key, c->slots[i].value[0] ? " " : "", c->slots[i].value);
    }
  }
  return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

char *qt_config_to_ini_string(const qt_config *c) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  const int rc = qt_config_write_ini(c, f);
  if (fclose(f) != 0 || rc != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

int qt_cli_parse_int(const char *prog, const char *opt, const char *s, long lo, long hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > hi) {
    fprintf(stderr, "%s: %s expects an integer in [%ld, %ld], found '%s'\n", prog, opt, lo, hi, s);
    return -1;
  }
  *out = (int)v;
  return 0;
}

int qt_cli_data_finish(const char *prog, qt_cli_data_options *d) {
  const int max = (int)(sizeof d->names / sizeof d->names[0]);
  if (d->values[0] && !d->outputs_path) {
    fprintf(stderr, "%s: --values names what --write-outputs writes; give --write-outputs too\n", prog);
    return -1;
  }
  d->n_names = 0;
  for (char *t = strtok(d->values, ","); t; t = strtok(NULL, ",")) {
    if (d->n_names == max) {
      fprintf(stderr, "%s: --values names more than %d values\n", prog, max);
      return -1;
    }
    d->names[d->n_names++] = t;
  }
  return 0;
}

int qt_cli_data_option(const char *prog, const char *accepted, int argc, char **argv, int *i, qt_cli_data_options *d) {
  enum { CONFIG, IMAGES, BATCH, OUTPUTS, VALUES, N_OPTS };
  static const char *const opts[N_OPTS] = {"--config", "--images", "--batch", "--write-outputs", "--values"};
  const char *opt = argv[*i];
  const int k = qt_name_index(opts, N_OPTS, opt);
  const char *at = k < 0 ? NULL : strstr(accepted, opt);
  const size_t len = strlen(opt);
  if (!at || (at[len] != 0 && at[len] != ' ') || *i + 1 >= argc) return 0;
  const char *v = argv[++*i];
  switch (k) {
    case CONFIG: d->config_path = v; return 1;
    case OUTPUTS: d->outputs_path = v; return 1;
    case VALUES:
      if (strlen(v) >= sizeof d->values) {
        fprintf(stderr, "%s: --values is longer than %zu characters\n", prog, sizeof d->values - 1);
        return -1;
      }
      snprintf(d->values, sizeof d->values, "%s", v);
      return 1;
    case IMAGES: return qt_cli_parse_int(prog, opt, v, 1, 1000000000, &d->images) ? -1 : 1;
    default: return qt_cli_parse_int(prog, opt, v, 1, 65536, &d->batch) ? -1 : 1;
  }
}
