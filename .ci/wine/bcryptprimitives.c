/* Test-only stand-in for bcryptprimitives.dll under Debian's wine 8.0, which lacks it.
 * Rust's standard library (1.78 and later) imports ProcessPrng from that DLL on Windows;
 * without it every Windows test binary fails to load under wine (exit status 53).
 * ProcessPrng fills a buffer with random bytes; here through RtlGenRandom (exported by
 * advapi32 as SystemFunction036), which takes at most a ULONG per call.
 * Real Windows 10 and 11 ship the DLL: this is built and installed by .ci/foreign only. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    const SIZE_T chunk = 1UL << 30;
    while (length > 0) {
        ULONG n = (ULONG)(length < chunk ? length : chunk);
        if (!SystemFunction036(data, n))
            return FALSE;
        data += n;
        length -= n;
    }
    return TRUE;
}
