/* SysV IPC objects of the sandbox's IPC namespace, made, shown, changed.
 *
 *   ipc make     a semaphore set (key 0x5a01, values 1 2 3), a private one
 *                owned by 1000:1000; a queue (key 0x5a02) with three
 *                messages, one binary, and 12000 bytes at most; a segment
 *                (key 0x5a03, 1 MiB + 100 bytes) with "alpha" at 0 and
 *                "omega" at 600000; an empty queue made by user 1000;
 *   ipc state    every object, its key, owner, creator, mode and state
 *                (values; messages with a hash of each; a hash of the
 *                segment's contents), and the next ids;
 *   ipc mutate   values, messages and contents changed, objects added;
 *                with `rm`, the checkpoint's objects removed too;
 *   ipc hold     attach the segment and sleep (a process holding it);
 *   ipc use      take from the first semaphore, receive the binary
 *                message, read the segment: what a program would do next.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/wait.h>

#define SEG_SIZE ((1 << 20) + 100)

union semun { int val; struct semid_ds *buf; unsigned short *array; };
struct message { long mtype; char mtext[4096]; };

static void die(const char *what) { perror(what); exit(1); }

static unsigned long hash(const unsigned char *p, size_t n) {
    unsigned long h = 1469598103934665603UL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211UL;
    return h;
}

static void send(int q, long type, const void *text, size_t n) {
    struct message m = { .mtype = type };
    memcpy(m.mtext, text, n);
    if (msgsnd(q, &m, n, IPC_NOWAIT) < 0) die("msgsnd");
}

static char *attach(int key, int flags) {
    int id = shmget(key, 0, 0);
    if (id < 0) die("shmget");
    char *p = shmat(id, NULL, flags);
    if (p == (void *)-1) die("shmat");
    return p;
}

static void make(void) {
    int s = semget(0x5a01, 3, IPC_CREAT | IPC_EXCL | 0640);
    if (s < 0) die("semget");
    unsigned short v[3] = { 1, 2, 3 };
    if (semctl(s, 0, SETALL, (union semun){ .array = v }) < 0) die("SETALL");
    int p = semget(IPC_PRIVATE, 1, IPC_CREAT | 0600);
    if (p < 0 || semctl(p, 0, SETVAL, (union semun){ .val = 7 }) < 0) die("private set");
    struct semid_ds ds;
    if (semctl(p, 0, IPC_STAT, (union semun){ .buf = &ds }) < 0) die("IPC_STAT");
    ds.sem_perm.uid = 1000, ds.sem_perm.gid = 1000;
    if (semctl(p, 0, IPC_SET, (union semun){ .buf = &ds }) < 0) die("IPC_SET");
    int q = msgget(0x5a02, IPC_CREAT | IPC_EXCL | 0620);
    if (q < 0) die("msgget");
    struct msqid_ds qd;
    if (msgctl(q, IPC_STAT, &qd) < 0) die("msgctl");
    qd.msg_qbytes = 12000;
    if (msgctl(q, IPC_SET, &qd) < 0) die("msgctl set");
    send(q, 1, "hello", 5);
    send(q, 7, "\0\1\2\377", 4);
    char big[3000];
    for (int i = 0; i < 3000; i++) big[i] = (char)(i * 7);
    send(q, 3, big, sizeof big);
    if (shmget(0x5a03, SEG_SIZE, IPC_CREAT | IPC_EXCL | 0644) < 0) die("shmget");
    char *seg = attach(0x5a03, 0);
    memcpy(seg, "alpha", 5);
    memcpy(seg + 600000, "omega", 5);
    shmdt(seg);
    /* A queue made by another user (its creator). */
    pid_t child = fork();
    if (child == 0) {
        if (setgid(1000) < 0 || setuid(1000) < 0 || msgget(0x5a04, IPC_CREAT | 0600) < 0) _exit(1);
        _exit(0);
    }
    int status;
    if (waitpid(child, &status, 0) < 0 || status != 0) die("a queue made by user 1000");
}

static void show_perm(const char *kind, int id, struct ipc_perm *p) {
    printf("%s id=%d key=%#x owner=%u:%u creator=%u:%u mode=%o", kind, id, p->__key, p->uid, p->gid, p->cuid,
           p->cgid, p->mode);
}

static void state(void) {
    struct seminfo si;
    int top = semctl(0, 0, SEM_INFO, (union semun){ .buf = (void *)&si });
    for (int i = 0; i <= top; i++) {
        struct semid_ds ds;
        int id = semctl(i, 0, SEM_STAT_ANY, (union semun){ .buf = &ds });
        if (id < 0) continue;
        show_perm("sem", id, &ds.sem_perm);
        unsigned short v[64];
        semctl(id, 0, GETALL, (union semun){ .array = v });
        printf(" values=");
        for (unsigned long n = 0; n < ds.sem_nsems && n < 64; n++) printf("%u,", v[n]);
        printf("\n");
    }
    struct msginfo mi;
    top = msgctl(0, MSG_INFO, (struct msqid_ds *)&mi);
    for (int i = 0; i <= top; i++) {
        struct msqid_ds ds;
        int id = msgctl(i, MSG_STAT_ANY, &ds);
        if (id < 0) continue;
        show_perm("msg", id, &ds.msg_perm);
        printf(" qnum=%lu cbytes=%lu qbytes=%lu", ds.msg_qnum, ds.__msg_cbytes, ds.msg_qbytes);
        for (unsigned long n = 0; n < ds.msg_qnum; n++) {
            struct message m;
            ssize_t got = msgrcv(id, &m, sizeof m.mtext, n, MSG_COPY | IPC_NOWAIT);
            if (got < 0) die("MSG_COPY");
            printf(" [%ld %zd %lx]", m.mtype, got, hash((unsigned char *)m.mtext, got));
        }
        printf("\n");
    }
    struct shm_info hi;
    top = shmctl(0, SHM_INFO, (struct shmid_ds *)&hi);
    for (int i = 0; i <= top; i++) {
        struct shmid_ds ds;
        int id = shmctl(i, SHM_STAT_ANY, &ds);
        if (id < 0) continue;
        show_perm("shm", id, &ds.shm_perm);
        char *p = shmat(id, NULL, SHM_RDONLY);
        if (p == (void *)-1) die("shmat");
        printf(" size=%zu contents=%lx\n", ds.shm_segsz, hash((unsigned char *)p, ds.shm_segsz));
        shmdt(p);
    }
    const char *kinds[] = { "sem", "msg", "shm" };
    for (int k = 0; k < 3; k++) {
        char path[64], buf[32] = "";
        snprintf(path, sizeof path, "/proc/sys/kernel/%s_next_id", kinds[k]);
        FILE *f = fopen(path, "r");
        if (f) { if (!fgets(buf, sizeof buf, f)) buf[0] = 0; fclose(f); }
        printf("%s_next_id=%s", kinds[k], buf);
    }
}

static void mutate(int rm) {
    int s = semget(0x5a01, 0, 0);
    unsigned short v[3] = { 5, 5, 5 };
    if (s < 0 || semctl(s, 0, SETALL, (union semun){ .array = v }) < 0) die("SETALL");
    int q = msgget(0x5a02, 0);
    struct message m;
    if (q < 0 || msgrcv(q, &m, sizeof m.mtext, 0, IPC_NOWAIT) < 0) die("msgrcv");
    send(q, 9, "later", 5);
    char *seg = attach(0x5a03, 0);
    memcpy(seg, "zzzz", 4);
    memcpy(seg + 700000, "late", 4);
    shmdt(seg);
    if (semget(0x5a09, 2, IPC_CREAT | 0600) < 0 || msgget(0x5a0a, IPC_CREAT | 0600) < 0 ||
        shmget(0x5a0b, 8192, IPC_CREAT | 0600) < 0)
        die("new objects");
    if (rm) {
        if (semctl(s, 0, IPC_RMID) < 0 || msgctl(q, IPC_RMID, NULL) < 0 ||
            shmctl(shmget(0x5a03, 0, 0), IPC_RMID, NULL) < 0)
            die("IPC_RMID");
        /* The private set too (found by its owner). */
        struct seminfo si;
        int top = semctl(0, 0, SEM_INFO, (union semun){ .buf = (void *)&si });
        for (int i = 0; i <= top; i++) {
            struct semid_ds ds;
            int id = semctl(i, 0, SEM_STAT_ANY, (union semun){ .buf = &ds });
            if (id >= 0 && ds.sem_perm.__key == 0) semctl(id, 0, IPC_RMID);
        }
    }
}

static void use(void) {
    int s = semget(0x5a01, 0, 0);
    struct sembuf op = { .sem_num = 0, .sem_op = -1, .sem_flg = IPC_NOWAIT };
    if (s < 0 || semop(s, &op, 1) < 0) die("semop");
    int q = msgget(0x5a02, 0);
    struct message m;
    ssize_t got = q < 0 ? -1 : msgrcv(q, &m, sizeof m.mtext, 7, IPC_NOWAIT);
    if (got != 4 || memcmp(m.mtext, "\0\1\2\377", 4)) die("msgrcv 7");
    char *seg = attach(0x5a03, SHM_RDONLY);
    printf("used: %.5s %.5s %d\n", seg, seg + 600000, seg[700000]);
}

int main(int argc, char **argv) {
    const char *cmd = argc > 1 ? argv[1] : "";
    if (!strcmp(cmd, "make")) make();
    else if (!strcmp(cmd, "state")) state();
    else if (!strcmp(cmd, "mutate")) mutate(argc > 2 && !strcmp(argv[2], "rm"));
    else if (!strcmp(cmd, "use")) use();
    else if (!strcmp(cmd, "hold")) {
        char *seg = attach(0x5a03, 0);
        (void)seg;
        printf("%d\n", getpid());
        fflush(stdout);
        for (;;) pause();
    } else {
        fprintf(stderr, "usage: ipc make|state|mutate [rm]|use|hold\n");
        return 2;
    }
    return 0;
}
