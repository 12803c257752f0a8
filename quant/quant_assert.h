/* The invariant check of the quantization sources (quant_qparams.c, quant_observer.c,
 * quant_fake.c): an internal error, not a user's, when cond is false. */
#ifndef QT_QUANT_ASSERT_H
#define QT_QUANT_ASSERT_H

#include "base/base.h"

#define QUANT_ASSERT(cond, msg) QT_ASSERT(cond, "invariant broken: %s", msg)

#endif
