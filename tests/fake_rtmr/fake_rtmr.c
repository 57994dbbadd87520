/* fake_rtmr.c: the kernel's /sys/class/misc/tdx_guest/measurements/rtmr3:sha384 for the
 * scenario worlds (issue 37), as an LD_PRELOAD shim over a regular file of the world.
 *
 * The agent opens the world's file (<root>/sys/.../rtmr3:sha384) and reads it as it would the
 * kernel's: a regular file of 48 bytes serves that. Only a write needs the kernel's rules,
 * which a regular file does not keep; this shim takes every write(2) on a descriptor of that
 * file (the same device and inode as FAKE_RTMR_PATH) and does what Linux 6.16's tsm-mr does:
 * exactly 48 bytes at offset 0, else EINVAL; the file then holds SHA-384(old || data).
 *
 * Environment: FAKE_RTMR_PATH the file; FAKE_RTMR_FAIL "refuse" (every write fails, EIO) or
 * "wrong" (the write returns 48 but the register holds something else after it).
 * SHA-384 comes from the system's libcrypto (dlopen: no headers needed to build).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAXFD 4096

static unsigned char is_register[MAXFD];

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef int (*close_fn)(int);
typedef unsigned char *(*sha384_fn)(const unsigned char *, size_t, unsigned char *);

static void *next(const char *name) { return dlsym(RTLD_NEXT, name); }

static void note(int fd) {
    const char *path = getenv("FAKE_RTMR_PATH");
    struct stat want, got;
    if (fd < 0 || fd >= MAXFD || !path)
        return;
    is_register[fd] = 0;
    if (stat(path, &want) == 0 && fstat(fd, &got) == 0 && want.st_dev == got.st_dev &&
        want.st_ino == got.st_ino)
        is_register[fd] = 1;
}

static int mode_of(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, int) : 0;
}

#define OPEN_HOOK(name)                                                   \
    int name(const char *path, int flags, ...) {                          \
        va_list ap;                                                       \
        va_start(ap, flags);                                              \
        int mode = mode_of(flags, ap);                                    \
        va_end(ap);                                                       \
        int fd = ((open_fn)next(#name))(path, flags, mode);               \
        note(fd);                                                         \
        return fd;                                                        \
    }
#define OPENAT_HOOK(name)                                                 \
    int name(int dirfd, const char *path, int flags, ...) {               \
        va_list ap;                                                       \
        va_start(ap, flags);                                              \
        int mode = mode_of(flags, ap);                                    \
        va_end(ap);                                                       \
        int fd = ((openat_fn)next(#name))(dirfd, path, flags, mode);      \
        note(fd);                                                         \
        return fd;                                                        \
    }

OPEN_HOOK(open)
OPEN_HOOK(open64)
OPENAT_HOOK(openat)
OPENAT_HOOK(openat64)

int close(int fd) {
    if (fd >= 0 && fd < MAXFD)
        is_register[fd] = 0;
    return ((close_fn)next("close"))(fd);
}

static int sha384(const unsigned char *data, size_t size, unsigned char *out) {
    static sha384_fn fn;
    if (!fn) {
        void *lib = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
        if (!lib)
            lib = dlopen("libcrypto.so.1.1", RTLD_NOW | RTLD_LOCAL);
        if (lib)
            fn = (sha384_fn)dlsym(lib, "SHA384");
    }
    if (!fn)
        return -1;
    fn(data, size, out);
    return 0;
}

ssize_t write(int fd, const void *buf, size_t count) {
    write_fn real = (write_fn)next("write");
    if (fd < 0 || fd >= MAXFD || !is_register[fd])
        return real(fd, buf, count);
    const char *fail = getenv("FAKE_RTMR_FAIL");
    if (count != 48 || lseek(fd, 0, SEEK_CUR) != 0) {
        errno = EINVAL;
        return -1;
    }
    if (fail && strcmp(fail, "refuse") == 0) {
        errno = EIO;
        return -1;
    }
    int rw = ((open_fn)next("open"))(getenv("FAKE_RTMR_PATH"), O_RDWR | O_CLOEXEC, 0);
    if (rw < 0) {
        errno = EIO;
        return -1;
    }
    unsigned char both[96], value[48];
    int ok = pread(rw, both, 48, 0) == 48;
    memcpy(both + 48, buf, 48);
    ok = ok && sha384(both, sizeof both, value) == 0;
    if (ok && fail && strcmp(fail, "wrong") == 0)
        value[0] ^= 0xff;
    ok = ok && pwrite(rw, value, 48, 0) == 48;
    ((close_fn)next("close"))(rw);
    if (!ok) {
        errno = EIO;
        return -1;
    }
    lseek(fd, 48, SEEK_SET); /* as the kernel's: a second write on it is not at offset 0 */
    return 48;
}
