/* The in-memory index: a FIFO ring of entries (oldest evicted first, as coss
 * and a simple ufs replacement policy do) and an open-addressing hash table
 * from object id to ring position. Saved to a file between phases. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "objbench.h"

static size_t hash(uint64_t id, size_t tsize)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ULL) >> 17) & (tsize - 1);
}

void index_init(struct index *ix, size_t cap)
{
    memset(ix, 0, sizeof *ix);
    ix->cap = cap;
    ix->ring = calloc(cap, sizeof *ix->ring);
    ix->tsize = 1;
    while (ix->tsize < cap * 2)
        ix->tsize <<= 1;
    ix->table = malloc(ix->tsize * sizeof *ix->table);
    for (size_t i = 0; i < ix->tsize; i++)
        ix->table[i] = -1;
}

static int64_t *slot_of(struct index *ix, uint64_t id, int for_insert)
{
    size_t h = hash(id, ix->tsize);
    int64_t *tomb = NULL;
    for (size_t i = 0; i < ix->tsize; i++, h = (h + 1) & (ix->tsize - 1)) {
        int64_t v = ix->table[h];
        if (v == -1)
            return for_insert && tomb ? tomb : &ix->table[h];
        if (v == -2) {
            if (!tomb)
                tomb = &ix->table[h];
            continue;
        }
        if (ix->ring[v].id == id && ix->ring[v].live)
            return &ix->table[h];
    }
    return tomb;
}

int64_t index_find(struct index *ix, uint64_t id)
{
    int64_t *s = slot_of(ix, id, 0);
    return s && *s >= 0 ? *s : -1;
}

int64_t index_add(struct index *ix, uint64_t id, uint64_t loc, uint32_t size)
{
    if (ix->count == ix->cap)
        return -1;
    int64_t pos = (int64_t)((ix->head + ix->count++) % ix->cap);
    ix->ring[pos] = (struct entry){ .id = id, .loc = loc, .size = size, .live = 1 };
    int64_t *s = slot_of(ix, id, 1);
    if (*s == -1)
        ix->used++;
    *s = pos;
    ix->bytes += size;
    ix->objects++;
    if (ix->used * 4 > ix->tsize * 3) {          /* too many tombstones: rebuild */
        for (size_t i = 0; i < ix->tsize; i++)
            ix->table[i] = -1;
        ix->used = 0;
        for (size_t i = 0; i < ix->count; i++) {
            size_t p = (ix->head + i) % ix->cap;
            if (ix->ring[p].live) {
                *slot_of(ix, ix->ring[p].id, 1) = (int64_t)p;
                ix->used++;
            }
        }
    }
    return pos;
}

void index_kill(struct index *ix, int64_t pos)
{
    struct entry *e = &ix->ring[pos];
    if (!e->live)
        return;
    int64_t *s = slot_of(ix, e->id, 0);
    if (s && *s == pos)
        *s = -2;
    e->live = 0;
    ix->bytes -= e->size;
    ix->objects--;
}

struct entry *index_oldest(struct index *ix, int64_t *pos)
{
    while (ix->count && !ix->ring[ix->head].live)
        index_pop(ix);
    if (!ix->count)
        return NULL;
    *pos = (int64_t)ix->head;
    return &ix->ring[ix->head];
}

void index_pop(struct index *ix)
{
    ix->head = (ix->head + 1) % ix->cap;
    ix->count--;
}

int index_save(struct index *ix, const char *path, const void *extra, size_t extra_len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    uint64_t live = ix->objects;
    fwrite(&live, sizeof live, 1, f);
    fwrite(extra, extra_len, 1, f);
    for (size_t i = 0; i < ix->count; i++) {
        struct entry *e = &ix->ring[(ix->head + i) % ix->cap];
        if (e->live)
            fwrite(e, sizeof *e, 1, f);
    }
    return fclose(f);
}

int index_load(struct index *ix, const char *path, void *extra, size_t extra_len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    uint64_t live;
    struct entry e;
    if (fread(&live, sizeof live, 1, f) != 1 || fread(extra, extra_len, 1, f) != 1) {
        fclose(f);
        return -1;
    }
    for (uint64_t i = 0; i < live && fread(&e, sizeof e, 1, f) == 1; i++)
        index_add(ix, e.id, e.loc, e.size);
    fclose(f);
    return 0;
}
