// <immintrin.h> for the files compiled with AVX-512 (kernels_avx512.cc, roofline_avx512.cc).
// GCC 12 warns, falsely, that the _mm512_undefined_* placeholders inside many AVX-512
// intrinsics are used uninitialized (GCC bug 105593). The warnings are silenced for the
// header's own lines only; the including file's code is still checked.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
