/*
 * The two functions the compiler may call even in freestanding code. One
 * string instruction each: under instruction emulation that is far cheaper
 * than a byte loop.
 */
#include <stddef.h>

#include "arch.h"

void *memset(void *d, int c, size_t n)
{
	void *p = d;

	__asm__ volatile("rep stosb" : "+D"(p), "+c"(n) : "a"(c) : "memory");
	return d;
}

void *memcpy(void *d, const void *s, size_t n)
{
	void *p = d;

	__asm__ volatile("rep movsb" : "+D"(p), "+S"(s), "+c"(n) : : "memory");
	return d;
}
