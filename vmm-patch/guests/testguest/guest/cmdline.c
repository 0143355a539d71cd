/* Kernel command line of the test guest; see cmdline.h. */
#include "cmdline.h"
#include "zipf.h"

#include <stddef.h>

static void err(struct tg_params *p, const char *msg, const char *tok, size_t toklen)
{
	size_t n = 0;

	while (*msg && n + 1 < TG_ERR_LEN)
		p->err[n++] = *msg++;
	if (tok) {
		const char *sep = ": '";

		while (*sep && n + 1 < TG_ERR_LEN)
			p->err[n++] = *sep++;
		while (toklen-- && n + 2 < TG_ERR_LEN)
			p->err[n++] = *tok++;
		if (n + 1 < TG_ERR_LEN)
			p->err[n++] = '\'';
	}
	p->err[n] = 0;
}

void tg_params_default(struct tg_params *p)
{
	*p = (struct tg_params){0};
	p->nsets = 2;
	p->hot[0] = 256;
	p->hot[1] = 256;
	p->nphases = 2;
	p->phase[0].weight[0] = 80;
	p->phase[0].weight[1] = 20;
	p->phase[0].len = 100000;
	p->phase[1].weight[0] = 20;
	p->phase[1].weight[1] = 80;
	p->phase[1].len = 100000;
	p->loop = 1;
	p->report = 1;
	p->report_seconds = 1;
	p->poll = 2048;
	p->seed = 1;
}

static int is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* [s, e) holds a number: decimal or 0x hex, decimal with k/m suffix. */
static int parse_u64(const char *s, const char *e, uint64_t *out)
{
	uint64_t v = 0, mul = 1;

	if (s == e)
		return -1;
	if (e - s > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		for (s += 2; s < e; s++) {
			unsigned d;

			if (is_digit(*s))
				d = (unsigned)(*s - '0');
			else if (*s >= 'a' && *s <= 'f')
				d = (unsigned)(*s - 'a' + 10);
			else if (*s >= 'A' && *s <= 'F')
				d = (unsigned)(*s - 'A' + 10);
			else
				return -1;
			if (v >> 60)
				return -1;
			v = v << 4 | d;
		}
		*out = v;
		return 0;
	}
	if (e[-1] == 'k' || e[-1] == 'K') {
		mul = 1000;
		e--;
	} else if (e[-1] == 'm' || e[-1] == 'M') {
		mul = 1000000;
		e--;
	}
	if (s == e)
		return -1;
	for (; s < e; s++) {
		if (!is_digit(*s))
			return -1;
		if (v > (UINT64_MAX - 9) / 10)
			return -1;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	if (v > UINT64_MAX / mul)
		return -1;
	*out = v * mul;
	return 0;
}

/* Number with an optional trailing 's' (seconds). */
static int parse_len(const char *s, const char *e, uint64_t *out, uint8_t *seconds)
{
	*seconds = 0;
	if (e > s && e[-1] == 's') {
		*seconds = 1;
		e--;
	}
	return parse_u64(s, e, out);
}

static int key_is(const char *k, const char *ke, const char *name)
{
	while (k < ke && *name && *k == *name) {
		k++;
		name++;
	}
	return k == ke && !*name;
}

static const char *find(const char *s, const char *e, char c)
{
	while (s < e && *s != c)
		s++;
	return s;
}

static int parse_hot(struct tg_params *p, const char *v, const char *ve)
{
	unsigned n = 0;

	while (v <= ve) {
		const char *c = find(v, ve, ',');
		uint64_t x;

		if (n == TG_MAX_SETS) {
			err(p, "hot= has more than 8 sets", v, (size_t)(ve - v));
			return -1;
		}
		if (parse_u64(v, c, &x) || x > 0xffffffffu) {
			err(p, "hot= wants page counts", v, (size_t)(c - v));
			return -1;
		}
		p->hot[n++] = (uint32_t)x;
		v = c + 1;
	}
	for (unsigned i = n; i < TG_MAX_SETS; i++)
		p->hot[i] = 0;
	p->nsets = n;
	return 0;
}

/* Exponent with up to 3 decimals, as thousandths. */
static int parse_milli(const char *s, const char *e, uint32_t *out)
{
	const char *dot = find(s, e, '.');
	uint64_t whole, frac = 0;
	long digits = e - dot - 1;

	if (parse_u64(s, dot, &whole) || whole > TG_ZIPF_MAX_MILLI / 1000)
		return -1;
	for (const char *c = s; c < dot; c++)
		if (!is_digit(*c))
			return -1;
	if (dot < e) {
		if (digits < 1 || digits > 3 || parse_u64(dot + 1, e, &frac))
			return -1;
		for (const char *c = dot + 1; c < e; c++)
			if (!is_digit(*c))
				return -1;
		while (digits++ < 3)
			frac *= 10;
	}
	if (whole * 1000 + frac > TG_ZIPF_MAX_MILLI)
		return -1;
	*out = (uint32_t)(whole * 1000 + frac);
	return 0;
}

static int parse_zipf(struct tg_params *p, const char *v, const char *ve)
{
	unsigned n = 0;

	while (v <= ve) {
		const char *c = find(v, ve, ',');

		if (n == TG_MAX_SETS) {
			err(p, "zipf= has more than 8 sets", v, (size_t)(ve - v));
			return -1;
		}
		p->zipf_cont[n] = c - v == 1 && *v == '+';
		p->zipf[n] = 0;
		if (!p->zipf_cont[n] && parse_milli(v, c, &p->zipf[n])) {
			err(p, "zipf= wants exponents 0 to 4 with up to 3 decimals, or +", v,
			    (size_t)(c - v));
			return -1;
		}
		n++;
		v = c + 1;
	}
	for (unsigned i = n; i < TG_MAX_SETS; i++) {
		p->zipf[i] = 0;
		p->zipf_cont[i] = 0;
	}
	p->nzipf = n;
	return 0;
}

/* Chains of zipf= `+` sets: every set in one gets its first set's exponent;
 * its later sets take no weight, and all but its last are touched whole. */
static int check_zipf(struct tg_params *p)
{
	if (p->nzipf > p->nsets) {
		err(p, "zipf= has more sets than hot=", NULL, 0);
		return -1;
	}
	if (p->zipf_cont[0]) {
		err(p, "zipf= set 0 cannot continue a previous set (+)", NULL, 0);
		return -1;
	}
	for (unsigned j = 1; j < p->nzipf; j++) {
		if (!p->zipf_cont[j])
			continue;
		p->zipf[j] = p->zipf[j - 1];
		for (unsigned i = 0; i < p->nphases; i++) {
			const struct tg_phase *ph = &p->phase[i];
			uint32_t prev = ph->active[j - 1];

			if (ph->weight[j]) {
				err(p, "a set that continues a zipf ranking (+) takes no weight: give it to the chain's first set",
				    NULL, 0);
				return -1;
			}
			if (prev && prev < p->hot[j - 1]) {
				err(p, "in a zipf chain only the last set may touch fewer than all its pages",
				    NULL, 0);
				return -1;
			}
		}
	}
	return 0;
}

/* deaf=/lie=: up to 8 windows STARTs+LENs, ascending and not overlapping. */
static int parse_windows(struct tg_params *p, const char *key, const char *v, const char *ve,
			 struct tg_window *w, unsigned *nw)
{
	unsigned n = 0;
	uint64_t end = 0;

	while (v <= ve) {
		const char *c = find(v, ve, ',');
		const char *plus = find(v, c, '+');
		uint64_t start, len;

		if (n == TG_MAX_WINDOWS) {
			err(p, key[0] == 'd' ? "deaf= has more than 8 windows" :
					       "lie= has more than 8 windows",
			    v, (size_t)(ve - v));
			return -1;
		}
		if (plus == c || plus == v || c == plus + 1 || plus[-1] != 's' || c[-1] != 's' ||
		    parse_u64(v, plus - 1, &start) || parse_u64(plus + 1, c - 1, &len) ||
		    len == 0 || start > 0xffffffffu || len > 0xffffffffu ||
		    start + len > 0xffffffffu) {
			err(p, "window wants STARTs+LENs (seconds, LEN > 0)", v, (size_t)(c - v));
			return -1;
		}
		if (n && start < end) {
			err(p, "windows must be in order and not overlap", v, (size_t)(c - v));
			return -1;
		}
		w[n].start = (uint32_t)start;
		w[n].len = (uint32_t)len;
		end = start + len;
		n++;
		v = c + 1;
	}
	for (unsigned i = n; i < TG_MAX_WINDOWS; i++)
		w[i] = (struct tg_window){0};
	*nw = n;
	return 0;
}

int tg_window_in(const struct tg_window *w, unsigned n, uint64_t sec)
{
	for (unsigned i = 0; i < n; i++)
		if (sec >= w[i].start && sec - w[i].start < w[i].len)
			return 1;
	return 0;
}

static int parse_phases(struct tg_params *p, const char *v, const char *ve)
{
	unsigned n = 0;

	while (v <= ve) {
		const char *c = find(v, ve, ',');
		const char *at = find(v, c, '@');
		const char *colon = find(at, c, ':');
		struct tg_phase *ph;
		const char *w = v;
		unsigned k = 0, sum = 0;

		if (n == TG_MAX_PHASES) {
			err(p, "phases= has more than 16 phases", v, (size_t)(ve - v));
			return -1;
		}
		ph = &p->phase[n];
		*ph = (struct tg_phase){0};
		if (at == c) {
			err(p, "phase wants W0/W1/...@LEN", v, (size_t)(c - v));
			return -1;
		}
		while (w <= at) {
			const char *sl = find(w, at, '/');
			uint64_t x;

			if (k == TG_MAX_SETS || parse_u64(w, sl, &x) || x > 100) {
				err(p, "phase weights are percents of up to 8 sets", v,
				    (size_t)(c - v));
				return -1;
			}
			ph->weight[k++] = (uint8_t)x;
			sum += (unsigned)x;
			w = sl + 1;
		}
		if (sum != 100) {
			err(p, "phase weights must sum to 100", v, (size_t)(c - v));
			return -1;
		}
		if (parse_len(at + 1, colon, &ph->len, &ph->seconds)) {
			err(p, "phase length wants N accesses or Ns seconds", v, (size_t)(c - v));
			return -1;
		}
		for (w = colon + 1, k = 0; colon < c && w <= c;) {
			const char *sl = find(w, c, '/');
			uint64_t x;

			if (k == TG_MAX_SETS || parse_u64(w, sl, &x) || x > 0xffffffffu) {
				err(p, "phase active pages want A0/A1/... of up to 8 sets", v,
				    (size_t)(c - v));
				return -1;
			}
			ph->active[k++] = (uint32_t)x;
			w = sl + 1;
		}
		n++;
		v = c + 1;
	}
	p->nphases = n;
	return 0;
}

static int parse_one(struct tg_params *p, const char *tok, const char *te)
{
	const char *eq = find(tok, te, '=');
	const char *v = eq + 1;
	uint64_t x;
	uint8_t secs;

	if (eq == te) {
		err(p, "cmdline wants key=value", tok, (size_t)(te - tok));
		return -1;
	}
	if (key_is(tok, eq, "hot"))
		return parse_hot(p, v, te);
	if (key_is(tok, eq, "phases"))
		return parse_phases(p, v, te);
	if (key_is(tok, eq, "zipf"))
		return parse_zipf(p, v, te);
	if (key_is(tok, eq, "deaf"))
		return parse_windows(p, "deaf", v, te, p->deaf, &p->ndeaf);
	if (key_is(tok, eq, "lie"))
		return parse_windows(p, "lie", v, te, p->lie, &p->nlie);
	if (key_is(tok, eq, "virtio_mem")) {
		static const char *const modes[] = {"on", "off", "mute", "error"};

		for (unsigned m = 0; m < 4; m++) {
			if (key_is(v, te, modes[m])) {
				p->vmem = (uint8_t)m;
				return 0;
			}
		}
		err(p, "virtio_mem= wants on, off, mute or error", tok, (size_t)(te - tok));
		return -1;
	}
	if (key_is(tok, eq, "report")) {
		if (parse_len(v, te, &x, &secs))
			goto bad;
		p->report = x;
		p->report_seconds = secs;
		return 0;
	}
	if (!key_is(tok, eq, "loop") && !key_is(tok, eq, "accesses") && !key_is(tok, eq, "poll") &&
	    !key_is(tok, eq, "seed") && !key_is(tok, eq, "rate") && !key_is(tok, eq, "quiet")) {
		err(p, "unknown key", tok, (size_t)(eq - tok));
		return -1;
	}
	if (parse_u64(v, te, &x))
		goto bad;
	if (key_is(tok, eq, "loop")) {
		if (x > 1)
			goto bad;
		p->loop = (uint8_t)x;
	} else if (key_is(tok, eq, "quiet")) {
		if (x > 1)
			goto bad;
		p->quiet = (uint8_t)x;
	} else if (key_is(tok, eq, "rate")) {
		p->rate = x;
	} else if (key_is(tok, eq, "accesses")) {
		p->accesses = x;
	} else if (key_is(tok, eq, "poll")) {
		if (x < 1 || x > 0xffffffffu)
			goto bad;
		p->poll = (uint32_t)x;
	} else {
		p->seed = x;
	}
	return 0;
bad:
	err(p, "bad value", tok, (size_t)(te - tok));
	return -1;
}

int tg_params_parse(const char *cmdline, struct tg_params *p)
{
	const char *s = cmdline;
	unsigned i, j;

	p->err[0] = 0;
	while (*s) {
		const char *e;

		while (*s == ' ' || *s == '\t' || *s == '\n')
			s++;
		if (!*s)
			break;
		e = s;
		while (*e && *e != ' ' && *e != '\t' && *e != '\n')
			e++;
		if (parse_one(p, s, e))
			return -1;
		s = e;
	}
	for (i = 0; i < p->nphases; i++) {
		for (j = 0; j < TG_MAX_SETS; j++) {
			if (p->phase[i].weight[j] && (j >= p->nsets || !p->hot[j])) {
				err(p, "a phase sends accesses to a set with no hot pages", NULL, 0);
				return -1;
			}
		}
		for (j = 0; j < TG_MAX_SETS; j++) {
			if (p->phase[i].active[j] > p->hot[j]) {
				err(p, "a phase has more active pages than its hot set", NULL, 0);
				return -1;
			}
		}
		if (p->phase[i].len == 0 && i + 1 < p->nphases) {
			err(p, "only the last phase may have length 0 (forever)", NULL, 0);
			return -1;
		}
	}
	if (check_zipf(p))
		return -1;
	if (p->seed == 0)
		p->seed = 1; /* xorshift never leaves 0 */
	return 0;
}
