/* Helpers shared by the fuzz targets (fuzz_util.h): input splitting, scratch files, HDF5 checks
 * and the HDF5 checksum fix-ups, written from the HDF5 file format specification (version 3:
 * superblock, object header, data layout, filter pipeline, v1 B-tree and symbol table node). */
#include "fuzz/fuzz_util.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/h5.h"

int qt_fuzz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len, int max) {
  int n = 0;
  size_t start = 0;
  for (size_t i = 0; n < max - 1 && i + QT_FUZZ_SEP_LEN <= size; i++) {
    if (memcmp(data + i, QT_FUZZ_SEP, QT_FUZZ_SEP_LEN) != 0) continue;
    part[n] = data + start;
    len[n] = i - start;
    n++;
    start = i + QT_FUZZ_SEP_LEN;
    i = start - 1;
  }
  part[n] = data + start;
  len[n] = size - start;
  return n + 1;
}

/* ---- scratch files ---------------------------------------------------------------------------- */

#define N_SLOTS 8
static char slot_path[N_SLOTS][512];

static void remove_scratch(void) {
  for (int i = 0; i < N_SLOTS; i++)
    if (slot_path[i][0] && unlink(slot_path[i]) != 0) rmdir(slot_path[i]);
}

const char *qt_fuzz_path(int slot, const char *name) {
  QT_ASSERT(slot >= 0 && slot < N_SLOTS, "scratch slot %d out of range", slot);
  if (slot_path[slot][0]) return slot_path[slot];
  static int registered;
  if (!registered) {
    atexit(remove_scratch);
    registered = 1;
  }
  const char *dir = "/dev/shm";
  if (access(dir, W_OK) != 0) dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(slot_path[slot], sizeof slot_path[slot], "%s/qt-fuzz-%ld-%s", dir, (long)getpid(), name);
  return slot_path[slot];
}

void qt_fuzz_write_file(const char *path, const uint8_t *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  QT_ASSERT(fd >= 0, "fuzz: cannot create %s: %s", path, strerror(errno));
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, data + done, len - done);
    QT_ASSERT(w > 0, "fuzz: writing %s: %s", path, strerror(errno));
    done += (size_t)w;
  }
  QT_ASSERT(close(fd) == 0, "fuzz: closing %s: %s", path, strerror(errno));
}

/* ---- HDF5 --------------------------------------------------------------------------------------- */

void qt_fuzz_h5_init(void) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  qt_h5_set_contained(0); /* the readers run in this process: a crash in HDF5 is a finding */
  const int mb64 = 64 << 20;
  H5set_free_list_limits(mb64, mb64, mb64, mb64, mb64, mb64);
}

void qt_fuzz_h5_expect_closed(const char *what) {
  const ssize_t open_ids = H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL);
  QT_ASSERT(open_ids == 0, "fuzz: %s left %zd HDF5 objects open", what, open_ids);
}

/* Bob Jenkins' lookup3 hashlittle, byte by byte (HDF5's metadata checksum, initval 0). */
#define ROT(x, k) (((x) << (k)) | ((x) >> (32 - (k))))
// clang-format off
#define MIX(a, b, c) do { \
    a -= c; a ^= ROT(c, 4);  c += b; b -= a; b ^= ROT(a, 6);  a += c; c -= b; c ^= ROT(b, 8);  b += a; \
    a -= c; a ^= ROT(c, 16); c += b; b -= a; b ^= ROT(a, 19); a += c; c -= b; c ^= ROT(b, 4);  b += a; \
  } while (0)
#define FINAL(a, b, c) do { \
    c ^= b; c -= ROT(b, 14); a ^= c; a -= ROT(c, 11); b ^= a; b -= ROT(a, 25); c ^= b; c -= ROT(b, 16); \
    a ^= c; a -= ROT(c, 4);  b ^= a; b -= ROT(a, 14); c ^= b; c -= ROT(b, 24); \
  } while (0)
// clang-format on
uint32_t qt_fuzz_lookup3(const uint8_t *k, size_t length, uint32_t initval) {
  uint32_t a, b, c;
  a = b = c = 0xdeadbeefu + (uint32_t)length + initval;
  while (length > 12) {
    a += k[0] + ((uint32_t)k[1] << 8) + ((uint32_t)k[2] << 16) + ((uint32_t)k[3] << 24);
    b += k[4] + ((uint32_t)k[5] << 8) + ((uint32_t)k[6] << 16) + ((uint32_t)k[7] << 24);
    c += k[8] + ((uint32_t)k[9] << 8) + ((uint32_t)k[10] << 16) + ((uint32_t)k[11] << 24);
    MIX(a, b, c);
    length -= 12;
    k += 12;
  }
  switch (length) {                      /* every case falls through */
    case 12: c += (uint32_t)k[11] << 24; /* fall through */
    case 11: c += (uint32_t)k[10] << 16; /* fall through */
    case 10: c += (uint32_t)k[9] << 8;   /* fall through */
    case 9: c += k[8];                   /* fall through */
    case 8: b += (uint32_t)k[7] << 24;   /* fall through */
    case 7: b += (uint32_t)k[6] << 16;   /* fall through */
    case 6: b += (uint32_t)k[5] << 8;    /* fall through */
    case 5: b += k[4];                   /* fall through */
    case 4: a += (uint32_t)k[3] << 24;   /* fall through */
    case 3: a += (uint32_t)k[2] << 16;   /* fall through */
    case 2: a += (uint32_t)k[1] << 8;    /* fall through */
    case 1: a += k[0]; break;
    case 0: return c;
  }
  FINAL(a, b, c);
  return c;
}
#undef MIX
#undef FINAL
#undef ROT

/* Fletcher-32 over big-endian 16-bit words, sums starting at 0 (HDF5's variant); an odd last
 * byte is the high byte of a final word. */
uint32_t qt_fuzz_fletcher32(const uint8_t *data, size_t len) {
  uint32_t sum1 = 0, sum2 = 0;
  size_t words = len / 2;
  while (words) {
    size_t block = words > 360 ? 360 : words;
    words -= block;
    for (size_t i = 0; i < block; i++, data += 2) {
      sum1 += ((uint32_t)data[0] << 8) | data[1];
      sum2 += sum1;
    }
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  if (len % 2) {
    sum1 += (uint32_t)data[0] << 8;
    sum2 += sum1;
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  sum1 = (sum1 & 0xffff) + (sum1 >> 16);
  sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  return (sum2 << 16) | sum1;
}

/* The file being fixed: its bytes and the superblock's sizes of offsets and lengths. */
typedef struct {
  uint8_t *b;
  size_t n;
  int so, sl;
  uint64_t base;
  int budget;  /* structures left to visit: bounds the work on cyclic or huge inputs */
  int written; /* checksums written */
} h5buf;

static int in_range(const h5buf *f, uint64_t at, uint64_t len) { return at <= f->n && len <= f->n - at; }

static uint64_t rd(const h5buf *f, uint64_t at, int bytes) {
  uint64_t v = 0;
  if (!in_range(f, at, (uint64_t)bytes)) return UINT64_MAX;
  for (int i = bytes - 1; i >= 0; i--) v = v << 8 | f->b[at + (uint64_t)i];
  return v;
}

static void put32(h5buf *f, uint64_t at, uint32_t v) {
  f->written++;
  for (int i = 0; i < 4; i++) f->b[at + (uint64_t)i] = (uint8_t)(v >> (8 * i));
}

/* A file address (relative to the base address) as an offset into the buffer, or UINT64_MAX. */
static uint64_t addr(const h5buf *f, uint64_t a) {
  if (a == UINT64_MAX || a > f->n || f->base > f->n - a) return UINT64_MAX;
  return a + f->base;
}

static void fix_fletcher_chunk(h5buf *f, uint64_t at, uint64_t size) {
  if (at == UINT64_MAX || size <= 4 || !in_range(f, at, size)) return;
  put32(f, at + size - 4, qt_fuzz_fletcher32(f->b + at, (size_t)(size - 4)));
}

/* What one object header says about its dataset's storage. */
typedef struct {
  int fletcher_last; /* the pipeline's last filter is Fletcher-32 (id 3) */
  int layout;        /* 0 none, 3 (v1 B-tree) or 4 (single chunk) */
  uint64_t btree, dimensionality, chunk_addr, chunk_size, chunk_mask;
} storage;

static void parse_pipeline(const h5buf *f, uint64_t p, uint64_t size, storage *s) {
  const uint64_t end = p + size;
  const int version = (int)rd(f, p, 1), nfilters = (int)rd(f, p + 1, 1);
  if (version != 1 && version != 2) return;
  p += version == 1 ? 8 : 2;
  int last = -1;
  for (int i = 0; i < nfilters && p + (version == 1 ? 8 : 6) <= end; i++) {
    const uint64_t id = rd(f, p, 2);
    uint64_t name_len = 0, nvalues;
    if (version == 1 || id >= 256) {
      name_len = rd(f, p + 2, 2);
      p += 4;
    } else {
      p += 2;
    }
    p += 2; /* flags */
    nvalues = rd(f, p, 2);
    p += 2;
    if (name_len == UINT64_MAX || nvalues == UINT64_MAX) return;
    if (version == 1) name_len = (name_len + 7) / 8 * 8;
    p += name_len + 4 * nvalues;
    if (version == 1 && nvalues % 2) p += 4;
    last = (int)id;
  }
  s->fletcher_last = last == 3;
}

static void parse_layout(const h5buf *f, uint64_t p, uint64_t size, storage *s) {
  const uint64_t version = rd(f, p, 1), cls = rd(f, p + 1, 1);
  if (cls != 2 || size < 4) return;
  if (version == 3) {
    s->dimensionality = rd(f, p + 2, 1);
    s->btree = rd(f, p + 3, f->so);
    s->layout = 3;
  } else if (version == 4) {
    const uint64_t flags = rd(f, p + 2, 1), ndims = rd(f, p + 3, 1), enc = rd(f, p + 4, 1);
    if (ndims == UINT64_MAX || enc == UINT64_MAX) return;
    uint64_t q = p + 5 + ndims * enc;
    if (rd(f, q, 1) != 1) return; /* only the single-chunk index */
    q++;
    if (!(flags & 2)) return; /* unfiltered */
    s->chunk_size = rd(f, q, f->sl);
    s->chunk_mask = rd(f, q + (uint64_t)f->sl, 4);
    s->chunk_addr = rd(f, q + (uint64_t)f->sl + 4, f->so);
    s->layout = 4;
  }
}

/* A version-1 B-tree of chunks (type 1): leaves point at chunks, keys hold their sizes. */
static void fix_btree_chunks(h5buf *f, uint64_t a, uint64_t dimensionality, int depth) {
  const uint64_t at = addr(f, a);
  if (depth > 8 || --f->budget < 0 || at == UINT64_MAX || !in_range(f, at, 8) || memcmp(f->b + at, "TREE", 4) != 0 ||
      f->b[at + 4] != 1 || dimensionality == 0 || dimensionality > 33)
    return;
  const int level = f->b[at + 5];
  const uint64_t entries = rd(f, at + 6, 2), key = 8 + 8 * dimensionality;
  uint64_t p = at + 8 + 2 * (uint64_t)f->so;
  for (uint64_t i = 0; i < entries && in_range(f, p, key + (uint64_t)f->so); i++, p += key + (uint64_t)f->so) {
    const uint64_t child = rd(f, p + key, f->so);
    if (level > 0)
      fix_btree_chunks(f, child, dimensionality, depth + 1);
    else if (rd(f, p + 4, 4) == 0)
      fix_fletcher_chunk(f, addr(f, child), rd(f, p, 4));
  }
}

static void fix_storage(h5buf *f, const storage *s) {
  if (!s->fletcher_last) return;
  if (s->layout == 4 && s->chunk_mask == 0) fix_fletcher_chunk(f, addr(f, s->chunk_addr), s->chunk_size);
  if (s->layout == 3) fix_btree_chunks(f, s->btree, s->dimensionality, 0);
}

/* ---- version 2 object headers (OHDR + OCHK, checksummed) ---- */

static void v2_messages(h5buf *f, uint64_t p, uint64_t end, int flags, storage *s, int depth);

static void fix_ochk(h5buf *f, uint64_t a, uint64_t len, int flags, storage *s, int depth) {
  const uint64_t at = addr(f, a);
  if (depth > 16 || --f->budget < 0 || at == UINT64_MAX || len < 8 || !in_range(f, at, len) ||
      memcmp(f->b + at, "OCHK", 4) != 0)
    return;
  v2_messages(f, at + 4, at + len - 4, flags, s, depth + 1);
  put32(f, at + len - 4, qt_fuzz_lookup3(f->b + at, (size_t)(len - 4), 0));
}

static void v2_messages(h5buf *f, uint64_t p, uint64_t end, int flags, storage *s, int depth) {
  const uint64_t head = (flags & 0x04) ? 6 : 4;
  while (p + head <= end) {
    const uint64_t type = rd(f, p, 1), size = rd(f, p + 1, 2);
    p += head;
    if (size > end - p) return;
    if (type == 0x0B)
      parse_pipeline(f, p, size, s);
    else if (type == 0x08)
      parse_layout(f, p, size, s);
    else if (type == 0x10)
      fix_ochk(f, rd(f, p, f->so), rd(f, p + (uint64_t)f->so, f->sl), flags, s, depth);
    p += size;
  }
}

static void fix_ohdr(h5buf *f, uint64_t at) {
  if (!in_range(f, at, 7) || f->b[at + 4] != 2) return;
  const int flags = f->b[at + 5];
  uint64_t p = at + 6 + ((flags & 0x20) ? 16 : 0) + ((flags & 0x10) ? 4 : 0);
  const int width = 1 << (flags & 3);
  const uint64_t size = rd(f, p, width);
  p += (uint64_t)width;
  if (size == UINT64_MAX || !in_range(f, p, size) || !in_range(f, p + size, 4)) return;
  storage s = {0};
  v2_messages(f, p, p + size, flags, &s, 0);
  fix_storage(f, &s);
  put32(f, p + size, qt_fuzz_lookup3(f->b + at, (size_t)(p + size - at), 0));
}

/* ---- version 1 object headers (no checksum; their datasets' chunks may have one) ---- */

static void v1_messages(h5buf *f, uint64_t p, uint64_t end, storage *s, int depth) {
  while (p + 8 <= end && --f->budget >= 0) {
    const uint64_t type = rd(f, p, 2), size = rd(f, p + 2, 2);
    p += 8;
    if (size > end - p) return;
    if (type == 0x0B)
      parse_pipeline(f, p, size, s);
    else if (type == 0x08)
      parse_layout(f, p, size, s);
    else if (type == 0x10 && depth < 16) {
      const uint64_t at = addr(f, rd(f, p, f->so)), len = rd(f, p + (uint64_t)f->so, f->sl);
      if (at != UINT64_MAX && in_range(f, at, len)) v1_messages(f, at, at + len, s, depth + 1);
    }
    p += size;
  }
}

static void fix_v1_object(h5buf *f, uint64_t a) {
  const uint64_t at = addr(f, a);
  if (at == UINT64_MAX || !in_range(f, at, 16) || f->b[at] != 1) return;
  const uint64_t size = rd(f, at + 8, 4);
  if (!in_range(f, at + 16, size)) return;
  storage s = {0};
  v1_messages(f, at + 16, at + 16 + size, &s, 0);
  fix_storage(f, &s);
}

int qt_fuzz_h5_fix_checksums(uint8_t *buf, size_t n) {
  static const uint8_t sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  h5buf f = {.b = buf, .n = n, .so = 8, .sl = 8, .budget = 4096};
  if (n < 48 || memcmp(buf, sig, 8) != 0) return 0;
  const int version = buf[8];
  if (version == 2 || version == 3) {
    f.so = buf[9];
    f.sl = buf[10];
  } else if (version <= 1) {
    f.so = buf[13];
    f.sl = buf[14];
  }
  if ((f.so != 2 && f.so != 4 && f.so != 8) || (f.sl != 2 && f.sl != 4 && f.sl != 8)) return 0;
  if (version == 2 || version == 3) f.base = rd(&f, 12, f.so);
  if (f.base >= n) f.base = 0;
  if (version <= 1) {
    /* Datasets named by symbol table nodes (SNOD entries: name offset, object header address,
     * cache type, reserved, scratch), and the root group's entry in the superblock. */
    const uint64_t root_entry = (version == 0 ? 24 : 28) + 4 * (uint64_t)f.so;
    f.base = rd(&f, version == 0 ? 24 : 28, f.so);
    if (f.base >= n) f.base = 0;
    fix_v1_object(&f, rd(&f, root_entry + (uint64_t)f.so, f.so));
    const uint64_t entry = 2 * (uint64_t)f.so + 24;
    for (size_t i = 0; i + 8 <= n && f.budget > 0; i++) {
      if (memcmp(buf + i, "SNOD", 4) != 0) continue;
      const uint64_t count = rd(&f, i + 6, 2);
      for (uint64_t k = 0; k < count && in_range(&f, i + 8 + (k + 1) * entry, 0); k++)
        fix_v1_object(&f, rd(&f, i + 8 + k * entry + (uint64_t)f.so, f.so));
    }
  }
  for (size_t i = 0; i + 4 <= n && f.budget > 0; i++)
    if (buf[i] == 'O' && memcmp(buf + i, "OHDR", 4) == 0) fix_ohdr(&f, i);
  if (version == 2 || version == 3) {
    const uint64_t at = 12 + 4 * (uint64_t)f.so;
    if (in_range(&f, at, 4)) put32(&f, at, qt_fuzz_lookup3(buf, (size_t)at, 0));
  }
  return f.written;
}
