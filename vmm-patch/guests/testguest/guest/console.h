/* COM1 output and a small printf (%s %c %d %u %x with l/ll, width and 0). */
#ifndef TG_CONSOLE_H
#define TG_CONSOLE_H

void con_puts(const char *s);
void con_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print `tg error ...` and stop the guest. */
void __attribute__((noreturn)) die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
