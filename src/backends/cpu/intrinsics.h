// <immintrin.h> for the CPU backend: include this instead, and before any header
// that includes it. GCC 12's AVX-512 intrinsics self-initialize their "undefined"
// operands (the _mm512_undefined_* idiom, GCC bug 105593), which -Wall reports as
// (maybe-)uninitialized at the header's own lines once inlined into a kernel: a
// false positive, silenced for the header's lines only (push/pop).
#pragma once
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
