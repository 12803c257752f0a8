/* Shared by the fuzz targets (fuzz/README.md): the libFuzzer entry points, scratch files under
 * /dev/shm (the readers take paths), splitting one input into several files, HDF5 checksum
 * fix-ups (so mutations reach the readers instead of HDF5's checksum checks) and the checks every
 * target makes after a call (no HDF5 object left open).
 *
 * Each target defines LLVMFuzzerInitialize and LLVMFuzzerTestOneInput. Built with QT_FUZZ=ON
 * (clang) they link libFuzzer's main; in the normal build they link replay_main.c, which runs
 * every file of the target's corpus and regression folders through the same entry point (CTest
 * tests fuzz_replay_<target>). A target reports a broken contract with QT_ASSERT (abort), which
 * both libFuzzer and the replay test count as a failure. */
#ifndef QT_FUZZ_UTIL_H
#define QT_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The separator between the files of a multi-file input (IDX images and labels, the files of
 * an image folder, an INI file and its overrides). In every target's dictionary. */
#define QT_FUZZ_SEP "@@QTFUZZ@@"
#define QT_FUZZ_SEP_LEN 10

/* Up to max parts of data split at QT_FUZZ_SEP: part[i] points into data, len[i] its length.
 * Returns the number of parts (at least 1). */
int qt_fuzz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len, int max);

/* A scratch path unique to this process: "<dir>/qt-fuzz-<pid>-<name>", dir /dev/shm when it is
 * writable, else $TMPDIR or /tmp. Returns a static buffer per call site's slot (0..7). Every
 * path handed out is removed at exit (files, and directories emptied by the target). */
const char *qt_fuzz_path(int slot, const char *name);
/* Writes len bytes to path (created or truncated); aborts when the scratch disk fails. */
void qt_fuzz_write_file(const char *path, const uint8_t *data, size_t len);

/* HDF5: silences the error stack and raises HDF5's free-list limits to 64 MB: with the default
 * (or none) every file open callocs its metadata cache (about 1 MB) afresh, which ASan serves
 * from fresh mappings, and the page faults made executions ten times slower. */
void qt_fuzz_h5_init(void);
/* Aborts naming `what` when an HDF5 object (file, group, dataset, attribute, type, space) is
 * still open after a reader returned: a leaked id keeps the file open and its memory alive. */
void qt_fuzz_h5_expect_closed(const char *what);

/* Recomputes, in place, the checksums a mutation breaks in an HDF5 file: the v2/v3 superblock,
 * v2 object headers (OHDR) and their continuation chunks (OCHK), all Jenkins lookup3, and the
 * Fletcher-32 of chunked datasets indexed by a single-chunk layout (v4) or a version-1 B-tree
 * (v3), the two the project's writers produce. Inputs that do not parse are left as they are.
 * Mutated metadata and data then reach the reader; checksum failures themselves are HDF5's
 * business and covered by tests/qdq/test_qdq_fuzz.c. Returns the number of checksums written. */
int qt_fuzz_h5_fix_checksums(uint8_t *buf, size_t n);
/* The two checksums, as HDF5 computes them (exposed for the self-test in fuzz_util.c). */
uint32_t qt_fuzz_lookup3(const uint8_t *k, size_t length, uint32_t initval);
uint32_t qt_fuzz_fletcher32(const uint8_t *data, size_t len);

#endif
