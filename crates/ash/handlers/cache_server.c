/* A cache server (the paper's §5 web server, reduced): the application keeps
 * a cache in its window (layout in exonet_ash.h); a request whose UDP payload
 * is a key is answered from the cache on a hit and consumed; a miss (or a
 * malformed request or cache) aborts, so the application answers it. */
#include "exonet_ash.h"

static uint8_t key[ASH_CACHE_MAX_KEY], entry_key[ASH_CACHE_MAX_KEY];
static uint8_t value[ASH_CACHE_MAX_VALUE];

int ash_handle(int frame_len) {
    (void)frame_len;
    int32_t n = ash_skip_udp_headers();
    if (n <= 0 || (uint32_t)window_len() < ASH_CACHE_HEADER_LEN)
        ash_abort();
    uint32_t count = window_load32(0), key_size = window_load32(4), value_size = window_load32(8);
    if (key_size > ASH_CACHE_MAX_KEY || value_size > ASH_CACHE_MAX_VALUE || (uint32_t)n > key_size)
        ash_abort();
    uint32_t entry_len = 8 + key_size + value_size;
    if (count > ((uint32_t)window_len() - ASH_CACHE_HEADER_LEN) / entry_len)
        ash_abort();
    consume(key, n);
    for (uint32_t i = 0; i < count; i++) {
        uint32_t e = ASH_CACHE_HEADER_LEN + i * entry_len;
        if (window_load32(e) != (uint32_t)n)
            continue;
        window_read(entry_key, e + 8, n);
        int32_t j = 0;
        while (j < n && key[j] == entry_key[j])
            j++;
        if (j < n)
            continue;
        uint32_t value_len = window_load32(e + 4);
        if (value_len > value_size)
            ash_abort();
        window_read(value, e + 8 + key_size, (int32_t)value_len);
        if (reply_udp(value, (int32_t)value_len) < 0)
            ash_abort();
        return ASH_CONSUMED;
    }
    ash_abort(); /* a miss: the application answers */
}
