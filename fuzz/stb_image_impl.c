/* The fuzz build's own copy of stb_image (the Debian header, same version as libstb), compiled
 * with the fuzzer's instrumentation so that coverage and the sanitizers reach the decoders the
 * image-folder reader calls; its definitions take precedence over libstb.so's. */
#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>
