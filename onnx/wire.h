/* A bounded first pass over a protobuf message before protobuf-c unpacks it. protobuf-c's
 * unpack recurses once per nested message and allocates every element of every repeated field,
 * with no limits: a 30 KB file nesting a graph attribute 3,000 levels deep overflows the stack,
 * and 50 MB of empty nodes costs gigabytes. This walk reads the wire format with an explicit
 * stack, guided by the generated descriptors (which fields hold nested messages), and refuses
 * before any allocation: nesting deeper than max_depth, more than max_messages nested messages
 * in all, a tag or length that runs past its message, a field number 0 or a group (wire types 3
 * and 4, which ONNX never uses). Internal to qt_onnx. */
#ifndef QT_ONNX_WIRE_H
#define QT_ONNX_WIRE_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* 0 when buf (len bytes) may be unpacked as a message of type desc; -1 with what (n bytes): the
 * reason, and where (the byte offset). */
int qt_onnx_wire_check(const uint8_t *buf, size_t len, const ProtobufCMessageDescriptor *desc, int max_depth,
                       long max_messages, char *what, size_t n);

#endif
