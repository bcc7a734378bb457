/* threads-zstd - zstd's multi-threaded compressor (third-party code, libzstd
 * 1.5.4 built with ZSTD_MULTITHREAD) under a small driver.
 *
 * The driver makes a deterministic, compressible, text-like input in memory
 * (words from a skewed vocabulary, numbers, and now and then a copy of an
 * earlier span from far back, so that long matches across job boundaries
 * occur), compresses it with ZSTD_c_nbWorkers = THREADS, decompresses the
 * frame on the main thread and compares. zstd cuts the input into jobs of a
 * fixed size (ZSTD_c_jobSize) whatever the worker count, and every job
 * starts from the same overlap of the previous one, so the compressed bytes
 * are the same for 1..8 workers; THREADS=1 still uses one worker thread
 * (nbWorkers=0 would write a differently cut frame, in the caller's thread).
 */
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_c_jobSize and ZSTD_c_overlapLog */
#include "zstd.h"
#include "threads_common.h"

/* 512 KiB is zstd's minimum job size: the small input still makes 8 jobs,
 * enough to keep 8 workers busy. */
#define JOB_SIZE (512u << 10)
#define SEED 0x7a73746474687264ull
#define VOCAB 512

struct params {
    size_t n;  /* input bytes */
    int level; /* zstd compression level */
};

/* Word `w` of the vocabulary: 3..10 lowercase letters. */
static size_t word(unsigned w, char *out)
{
    uint64_t r = mix64(SEED ^ (0x100000000ull + w));
    size_t len = 3 + r % 8;
    for (size_t i = 0; i < len; i++) {
        r = mix64(r);
        out[i] = (char)('a' + r % 26);
    }
    return len;
}

/* Fills buf[0..n) with the pseudo-random text. Sequential by nature (copies
 * read what was written before), and cheap next to the compression. */
static void make_input(unsigned char *buf, size_t n)
{
    static char vocab[VOCAB][10];
    static size_t vlen[VOCAB];
    for (unsigned w = 0; w < VOCAB; w++)
        vlen[w] = word(w, vocab[w]);
    size_t pos = 0, next_copy = 1 << 16;
    for (uint64_t k = 0; pos < n; k++) {
        uint64_t r = mix64(SEED + k);
        char tok[32];
        size_t len;
        if (pos >= next_copy) {
            /* An earlier span, 1..4 KiB long, from up to 4 MiB back. */
            uint64_t c = mix64(r);
            size_t span = 1024 + c % 3072, back = span + (c >> 16) % (4u << 20);
            if (back > pos)
                back = pos;
            if (span > n - pos)
                span = n - pos;
            if (span > back)
                span = back;
            memcpy(buf + pos, buf + pos - back, span); /* span <= back: no overlap */
            pos += span;
            next_copy = pos + 32768 + (c >> 40) % 65536;
            continue;
        }
        if ((r >> 56) < 12) {
            len = (size_t)snprintf(tok, sizeof tok, "%u", (unsigned)((r >> 8) % 100000));
        } else {
            /* The product of two uniform indices favours the small ones. */
            unsigned w = (unsigned)((r % VOCAB) * ((r >> 16) % VOCAB) / VOCAB);
            memcpy(tok, vocab[w], vlen[w]);
            len = vlen[w];
        }
        unsigned sep = (unsigned)((r >> 48) & 0x3f);
        tok[len++] = sep == 0 ? '\n' : sep < 4 ? ',' : sep < 6 ? '.' : ' ';
        if (len > n - pos)
            len = n - pos;
        memcpy(buf + pos, tok, len);
        pos += len;
    }
}

static int zcheck(size_t rc, const char *what)
{
    if (ZSTD_isError(rc)) {
        fprintf(stderr, "threads-zstd: %s: %s\n", what, ZSTD_getErrorName(rc));
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    struct args a = parse_args("threads-zstd", argc, argv);
    struct params p = a.size == SIZE_S ? (struct params){ 4u << 20, 9 }
                                       : (struct params){ 24u << 20, 9 };
    printf("threads-zstd: zstd %s, input=%zu level=%d job=%u\n", ZSTD_versionString(), p.n,
           p.level, JOB_SIZE);

    unsigned char *in = malloc(p.n), *out = malloc(p.n);
    size_t bound = ZSTD_compressBound(p.n);
    unsigned char *z = malloc(bound);
    need(in && out && z, "malloc");
    make_input(in, p.n);
    printf("input hash: %016llx\n", (unsigned long long)fnv1a(HASH_INIT, in, p.n));

    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    need(cctx != NULL, "ZSTD_createCCtx");
    /* nbWorkers fails unless the library was built with ZSTD_MULTITHREAD:
     * that would silently test nothing, so it is fatal. */
    need(zcheck(ZSTD_CCtx_setParameter(cctx, ZSTD_c_nbWorkers, a.threads), "nbWorkers") &&
             zcheck(ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, p.level), "level") &&
             zcheck(ZSTD_CCtx_setParameter(cctx, ZSTD_c_jobSize, JOB_SIZE), "jobSize") &&
             zcheck(ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1), "checksum"),
         "ZSTD_CCtx_setParameter");
    size_t zn = ZSTD_compress2(cctx, z, bound, in, p.n);
    need(zcheck(zn, "compress"), "ZSTD_compress2");
    ZSTD_freeCCtx(cctx);
    printf("compressed: %zu bytes\n", zn);
    printf("compressed hash: %016llx\n", (unsigned long long)fnv1a(HASH_INIT, z, zn));

    /* The check: one frame, of the right content size, that decompresses
     * (single-threaded, its checksum verified) to the input. */
    int ok = ZSTD_findFrameCompressedSize(z, zn) == zn &&
             ZSTD_getFrameContentSize(z, zn) == (unsigned long long)p.n;
    size_t dn = ZSTD_decompress(out, p.n, z, zn);
    ok = ok && zcheck(dn, "decompress") && dn == p.n && memcmp(in, out, p.n) == 0;
    printf("decompressed: %zu bytes, %s\n", ZSTD_isError(dn) ? 0 : dn,
           ok ? "identical" : "DIFFERENT");
    free(in);
    free(out);
    free(z);
    return finish(ok);
}
