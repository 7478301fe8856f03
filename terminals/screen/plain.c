/* plain.py's plain_escapes in C (loaded with ctypes; built by `make holder` into build/libtether-plain.so): the
 * worker looks at every byte of a shell's output with a screen kept to know whether a long run may be cut short,
 * and for coloured text (a colour change every few characters) Python's scans of the bytes cost 2.2 ms a MiB
 * where this costs 0.3. Without the library the worker uses plain.py's own (tests compare the two).
 *
 * Returns how many colour changes (ESC [ digits ; : m) `data` has when it is only text (printable bytes, UTF-8's
 * included, CR, LF, tab and backspace) and colour changes, a sequence cut short at the end counting; -1 when it
 * has anything else (another control or escape, or a C1 control written as UTF-8). */
#include <stddef.h>

static unsigned char text[256];
static int ready;

static void init(void) {
    for (int b = 0; b < 256; b++)
        text[b] = (b >= 0x20 && b != 0x7f) || b == '\r' || b == '\n' || b == '\t' || b == '\b';
    ready = 1;
}

long tether_plain_escapes(const unsigned char *data, size_t n) {
    if (!ready)
        init();
    long escapes = 0;
    size_t i = 0;
    while (i < n) {
        unsigned char b = data[i];
        if (text[b]) {
            if (b == 0xc2 && i + 1 < n && data[i + 1] >= 0x80 && data[i + 1] <= 0x9f)
                return -1;
            i++;
            continue;
        }
        if (b != 0x1b)
            return -1;
        escapes++;
        if (++i == n)
            break;
        if (data[i] != '[')
            return -1;
        i++;
        while (i < n && ((data[i] >= '0' && data[i] <= '9') || data[i] == ';' || data[i] == ':'))
            i++;
        if (i == n)
            break;
        if (data[i] != 'm')
            return -1;
        i++;
    }
    return escapes;
}
