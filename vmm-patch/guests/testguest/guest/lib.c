/*
 * The two functions the compiler may call even in freestanding code. One
 * string instruction each: under instruction emulation that is far cheaper
 * than a byte loop; 8 bytes per iteration when the buffers allow it (page
 * copies), as each iteration is emulated on its own.
 */
#include <stddef.h>
#include <stdint.h>

#include "arch.h"

void *memset(void *d, int c, size_t n)
{
	void *p = d;

	if ((((uintptr_t)d | n) & 7) == 0) {
		uint64_t v = 0x0101010101010101ULL * (uint8_t)c;

		n /= 8;
		__asm__ volatile("rep stosq" : "+D"(p), "+c"(n) : "a"(v) : "memory");
		return d;
	}
	__asm__ volatile("rep stosb" : "+D"(p), "+c"(n) : "a"(c) : "memory");
	return d;
}

void *memcpy(void *d, const void *s, size_t n)
{
	void *p = d;

	if ((((uintptr_t)d | (uintptr_t)s | n) & 7) == 0) {
		n /= 8;
		__asm__ volatile("rep movsq" : "+D"(p), "+S"(s), "+c"(n) : : "memory");
		return d;
	}
	__asm__ volatile("rep movsb" : "+D"(p), "+S"(s), "+c"(n) : : "memory");
	return d;
}
