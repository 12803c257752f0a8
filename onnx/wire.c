/* The bounded protobuf walk (wire.h). */
#include "onnx/wire.h"

#include <stdio.h>

typedef struct {
  const ProtobufCMessageDescriptor *desc;
  size_t end; /* offset one past the message's last byte */
} frame;

#define MAX_FRAMES 256

/* A base-128 varint at *pos (before end): 0 and *v, or -1 when it runs past end or past 10 bytes. */
static int varint(const uint8_t *buf, size_t *pos, size_t end, uint64_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= end) return -1;
    const uint8_t b = buf[(*pos)++];
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = x;
      return 0;
    }
  }
  return -1;
}

int qt_onnx_wire_check(const uint8_t *buf, size_t len, const ProtobufCMessageDescriptor *desc, int max_depth,
                       long max_messages, char *what, size_t n) {
  frame stack[MAX_FRAMES];
  if (max_depth >= MAX_FRAMES) max_depth = MAX_FRAMES - 1;
  int depth = 0;
  long messages = 0;
  stack[0] = (frame){desc, len};
  size_t pos = 0;
  while (depth >= 0) {
    frame *f = &stack[depth];
    if (pos == f->end) { /* the message ends: back to its parent */
      depth--;
      continue;
    }
    const size_t at = pos;
    uint64_t tag, v;
    if (varint(buf, &pos, f->end, &tag))
      return snprintf(what, n, "a field tag at byte %zu runs past its message (a %s)", at, f->desc->name), -1;
    const unsigned wire = (unsigned)(tag & 7);
    const uint64_t number = tag >> 3;
    if (number == 0 || number > 536870911u)
      return snprintf(what, n, "field number %llu at byte %zu (in a %s) is not valid", (unsigned long long)number, at,
                      f->desc->name),
             -1;
    switch (wire) {
      case 0:
        if (varint(buf, &pos, f->end, &v))
          return snprintf(what, n, "a varint at byte %zu runs past its message (a %s)", at, f->desc->name), -1;
        break;
      case 1:
      case 5: {
        const size_t w = wire == 1 ? 8 : 4;
        if (f->end - pos < w)
          return snprintf(what, n, "a fixed-size field at byte %zu runs past its message (a %s)", at, f->desc->name),
                 -1;
        pos += w;
        break;
      }
      case 2: {
        if (varint(buf, &pos, f->end, &v) || v > f->end - pos)
          return snprintf(what, n, "a length at byte %zu runs past its message (a %s)", at, f->desc->name), -1;
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(f->desc, (unsigned)number);
        if (fd && fd->type == PROTOBUF_C_TYPE_MESSAGE) {
          if (depth + 1 > max_depth)
            return snprintf(what, n, "messages nested deeper than %d levels (at byte %zu, a %s's field %s)", max_depth,
                            at, f->desc->name, fd->name),
                   -1;
          if (++messages > max_messages)
            return snprintf(what, n, "more than %ld nested messages (at byte %zu): not a model this importer takes",
                            max_messages, at),
                   -1;
          stack[++depth] = (frame){(const ProtobufCMessageDescriptor *)fd->descriptor, pos + (size_t)v};
        } else {
          pos += (size_t)v; /* bytes, a string or a packed array: its contents are not messages */
        }
        break;
      }
      default:
        return snprintf(what, n, "wire type %u at byte %zu (in a %s): groups are not used by ONNX", wire, at,
                        f->desc->name),
               -1;
    }
  }
  return 0;
}
