/* memory_and_registers: a double accumulator, an SSE vector and a counter in
 * memory, advanced only on command. Between requests it runs bursts that
 * keep a double and an __m128 live in xmm registers for ~10 ms without a call
 * or a store, so a checkpoint almost always stops it in the middle of one:
 * each burst's result is compared bit for bit with a reference, and a
 * difference (registers not brought back) counts in `bad`. Built in the
 * sandbox with `gcc -O2 -msse2`.
 * Commands: `state` -> `counter=N acc=<%a> vec=<%a,%a,%a,%a> bad=N`;
 * `advance` -> advances all three (and the reference), then as `state`;
 * `bursts` -> `bursts=<bursts run> bad=N`. */

#include <immintrin.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static double acc = 1.0;
static __m128 vec;
static long counter, bursts, bad;
static double ref_a;
static __m128 ref_v;

__attribute__((noinline, noipa)) static void burst(double a, __m128 v, double *ra, __m128 *rv) {
    const __m128 k = _mm_set1_ps(1.0000001f);
    const __m128 c = _mm_set_ps(0.5f, 0.25f, 0.125f, 0.0625f);
    for (long i = 0; i < 3000000; i++) {
        a = a * 1.0000001 + 0.5;
        v = _mm_add_ps(_mm_mul_ps(v, k), c);
    }
    *ra = a;
    *rv = v;
}

static void report(char *out, size_t n) {
    float f[4];
    _mm_storeu_ps(f, vec);
    snprintf(out, n, "counter=%ld acc=%a vec=%a,%a,%a,%a bad=%ld", counter, acc, f[0], f[1], f[2], f[3], bad);
}

int main(void) {
    vec = _mm_set_ps(4.0f, 3.0f, 2.0f, 1.0f);
    burst(acc, vec, &ref_a, &ref_v);
    int srv = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(7000);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(srv, (struct sockaddr *)&sa, sizeof sa) || listen(srv, 16)) {
        perror("listen");
        return 1;
    }
    for (;;) {
        double a;
        __m128 v;
        burst(acc, vec, &a, &v);
        bursts++;
        if (memcmp(&a, &ref_a, sizeof a) || memcmp(&v, &ref_v, sizeof v))
            bad++;
        int c = accept(srv, NULL, NULL);
        if (c < 0)
            continue;
        struct timeval tv = {5, 0};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char cmd[256], out[512];
        size_t len = 0;
        while (len < sizeof cmd - 1 && read(c, cmd + len, 1) == 1 && cmd[len] != '\n')
            len++;
        cmd[len] = 0;
        if (!strcmp(cmd, "ping")) {
            strcpy(out, "pong");
        } else if (!strcmp(cmd, "state")) {
            report(out, sizeof out);
        } else if (!strcmp(cmd, "bursts")) {
            snprintf(out, sizeof out, "bursts=%ld bad=%ld", bursts, bad);
        } else if (!strcmp(cmd, "advance")) {
            counter++;
            acc = acc * 1.5 + 0.25;
            vec = _mm_add_ps(_mm_mul_ps(vec, _mm_set1_ps(2.0f)), _mm_set1_ps(1.0f));
            burst(acc, vec, &ref_a, &ref_v);
            report(out, sizeof out);
        } else {
            snprintf(out, sizeof out, "error unknown command %s", cmd);
        }
        len = strlen(out);
        out[len++] = '\n';
        if (write(c, out, len) < 0)
            perror("write");
        close(c);
    }
}
