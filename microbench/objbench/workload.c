/* The PolyMix-3 content mix (Table 5.2 of the 2002 Squid performance paper),
 * Zipf popularity, and object contents that can be checked on read.
 *   image     65%    exponential, mean 4.5 KB
 *   HTML      15%    exponential, mean 8.5 KB
 *   download   0.5%  lognormal, mean 300 KB, sd 300 KB
 *   other     19.5%  lognormal, mean 25 KB, sd 10 KB
 * An object's size and bytes are functions of (id, seed): reproducible, and
 * every read can be verified without storing a checksum.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "objbench.h"

uint64_t rng_next(uint64_t *s)          /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

double rng_unit(uint64_t *s)
{
    return (rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static double lognormal(uint64_t *s, double mean, double sd)
{
    double sigma2 = log(1 + sd * sd / (mean * mean)), mu = log(mean) - sigma2 / 2;
    double u1 = rng_unit(s), u2 = rng_unit(s);
    double z = sqrt(-2 * log(u1 + 1e-300)) * cos(2 * M_PI * u2);
    return exp(mu + sqrt(sigma2) * z);
}

size_t object_size(uint64_t id, uint64_t seed)
{
    uint64_t s = id * 0x2545F4914F6CDD1DULL ^ seed;
    double pick = rng_unit(&s), kb;
    if (pick < 0.65)
        kb = -4.5 * log(1 - rng_unit(&s));
    else if (pick < 0.80)
        kb = -8.5 * log(1 - rng_unit(&s));
    else if (pick < 0.805)
        kb = lognormal(&s, 300, 300);
    else
        kb = lognormal(&s, 25, 10);
    size_t bytes = (size_t)(kb * 1024) + 1;
    return bytes > MAX_OBJECT ? MAX_OBJECT : bytes;
}

static uint64_t word_at(uint64_t id, size_t i)
{
    return (id + 1) * 0x9E3779B97F4A7C15ULL ^ (i * 0xD6E8FEB86659FD93ULL);
}

void fill_content(char *buf, uint64_t id, size_t len)
{
    size_t words = len / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w = word_at(id, i);
        memcpy(buf + i * 8, &w, 8);
    }
    uint64_t w = word_at(id, words);
    memcpy(buf + words * 8, &w, len - words * 8);
}

int check_content(const char *buf, uint64_t id, size_t len)
{
    size_t words = len / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w = word_at(id, i);
        if (memcmp(buf + i * 8, &w, 8))
            return 0;
    }
    uint64_t w = word_at(id, words);
    return memcmp(buf + words * 8, &w, len - words * 8) == 0;
}

struct zipf {
    size_t n;
    double *cdf;
};

struct zipf *zipf_new(size_t n, double alpha)
{
    struct zipf *z = malloc(sizeof *z);
    z->n = n;
    z->cdf = malloc(n * sizeof(double));
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        z->cdf[i] = (sum += 1.0 / pow((double)(i + 1), alpha));
    for (size_t i = 0; i < n; i++)
        z->cdf[i] /= sum;
    return z;
}

size_t zipf_draw(struct zipf *z, uint64_t *s)     /* rank 0 is the most popular */
{
    double u = rng_unit(s);
    size_t lo = 0, hi = z->n - 1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (z->cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
