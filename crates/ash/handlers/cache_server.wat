;; A cache server (the paper's §5 web server, reduced): the application keeps
;; a cache in its window (layout in exonet_ash.h, "cache_server"); a request
;; whose UDP payload is a key is answered from the cache on a hit and
;; consumed; a miss (or a malformed request or cache) aborts, so the
;; application answers it.
(module
  (import "exonet" "msg_len" (func $msg_len (result i32)))
  (import "exonet" "peek" (func $peek (param i32 i32 i32) (result i32)))
  (import "exonet" "seek" (func $seek (param i32) (result i32)))
  (import "exonet" "abort" (func $abort))
  (import "exonet" "consume" (func $consume (param i32 i32) (result i32)))
  (import "exonet" "window_len" (func $window_len (result i32)))
  (import "exonet" "window_load32" (func $window_load32 (param i32) (result i32)))
  (import "exonet" "window_read" (func $window_read (param i32 i32 i32)))
  (import "exonet" "reply_udp" (func $reply_udp (param i32 i32) (result i32)))
  (memory (export "memory") 1)

  ;; The request's key at 1024, an entry's key at 2048 (up to 1024 bytes
  ;; each), its value at 4096 (up to 32768 bytes).
  (func (export "ash_handle") (param $frame_len i32) (result i32)
    (local $n i32) (local $count i32) (local $key_size i32) (local $value_size i32)
    (local $entry_len i32) (local $i i32) (local $e i32) (local $value_len i32)
    (local.set $n (call $udp_payload))
    (if (i32.le_s (local.get $n) (i32.const 0))
      (then (call $abort)))
    (if (i32.lt_u (call $window_len) (i32.const 16))
      (then (call $abort)))
    (local.set $count (call $window_load32 (i32.const 0)))
    (local.set $key_size (call $window_load32 (i32.const 4)))
    (local.set $value_size (call $window_load32 (i32.const 8)))
    (if (i32.gt_u (local.get $key_size) (i32.const 1024))
      (then (call $abort)))
    (if (i32.gt_u (local.get $value_size) (i32.const 32768))
      (then (call $abort)))
    (if (i32.gt_u (local.get $n) (local.get $key_size))
      (then (call $abort)))
    (local.set $entry_len
      (i32.add (i32.const 8) (i32.add (local.get $key_size) (local.get $value_size))))
    (if (i32.gt_u (local.get $count)
                  (i32.div_u (i32.sub (call $window_len) (i32.const 16)) (local.get $entry_len)))
      (then (call $abort)))
    (drop (call $consume (i32.const 1024) (local.get $n)))
    (block $miss
      (loop $next
        (br_if $miss (i32.ge_u (local.get $i) (local.get $count)))
        (local.set $e (i32.add (i32.const 16) (i32.mul (local.get $i) (local.get $entry_len))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $next (i32.ne (call $window_load32 (local.get $e)) (local.get $n)))
        (call $window_read (i32.const 2048) (i32.add (local.get $e) (i32.const 8)) (local.get $n))
        (br_if $next (i32.eqz (call $same (i32.const 1024) (i32.const 2048) (local.get $n))))
        (local.set $value_len (call $window_load32 (i32.add (local.get $e) (i32.const 4))))
        (if (i32.gt_u (local.get $value_len) (local.get $value_size))
          (then (call $abort)))
        (call $window_read (i32.const 4096)
          (i32.add (local.get $e) (i32.add (i32.const 8) (local.get $key_size)))
          (local.get $value_len))
        (if (i32.lt_s (call $reply_udp (i32.const 4096) (local.get $value_len)) (i32.const 0))
          (then (call $abort)))
        (return (i32.const 0))))
    (call $abort)
    (unreachable))

  ;; 1 if the $n bytes at $a and $b are equal.
  (func $same (param $a i32) (param $b i32) (param $n i32) (result i32)
    (local $j i32)
    (block $differ
      (loop $byte
        (if (i32.ge_u (local.get $j) (local.get $n))
          (then (return (i32.const 1))))
        (br_if $differ (i32.ne (i32.load8_u (i32.add (local.get $a) (local.get $j)))
                               (i32.load8_u (i32.add (local.get $b) (local.get $j)))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $byte)))
    (i32.const 0))

  ;; ash_skip_udp_headers() of exonet_ash.h: checks the frame is untagged
  ;; Ethernet/IPv4/UDP (unfragmented, lengths consistent), moves the cursor
  ;; to the UDP payload and returns its length, or -1. Uses memory [0, 32).
  (func $udp_payload (result i32)
    (local $ihl i32) (local $ip_len i32) (local $udp_len i32)
    (if (i32.lt_s (call $peek (i32.const 0) (i32.const 0) (i32.const 24)) (i32.const 0))
      (then (return (i32.const -1))))
    (if (i32.ne (call $be16 (i32.const 12)) (i32.const 0x0800))
      (then (return (i32.const -1))))
    (if (i32.ne (i32.shr_u (i32.load8_u (i32.const 14)) (i32.const 4)) (i32.const 4))
      (then (return (i32.const -1))))
    (if (i32.ne (i32.load8_u (i32.const 23)) (i32.const 17))
      (then (return (i32.const -1))))
    (local.set $ihl (i32.shl (i32.and (i32.load8_u (i32.const 14)) (i32.const 0x0f)) (i32.const 2)))
    ;; options too short, or a fragment
    (if (i32.lt_s (local.get $ihl) (i32.const 20))
      (then (return (i32.const -1))))
    (if (i32.and (call $be16 (i32.const 20)) (i32.const 0x3fff))
      (then (return (i32.const -1))))
    (local.set $ip_len (call $be16 (i32.const 16)))
    (if (i32.lt_s (local.get $ip_len) (i32.add (local.get $ihl) (i32.const 8)))
      (then (return (i32.const -1))))
    (if (i32.gt_s (i32.add (i32.const 14) (local.get $ip_len)) (call $msg_len))
      (then (return (i32.const -1))))
    (if (i32.lt_s (call $peek (i32.const 24) (i32.add (i32.const 14) (local.get $ihl)) (i32.const 8))
                  (i32.const 0))
      (then (return (i32.const -1))))
    (local.set $udp_len (call $be16 (i32.const 28)))
    (if (i32.lt_s (local.get $udp_len) (i32.const 8))
      (then (return (i32.const -1))))
    (if (i32.gt_s (local.get $udp_len) (i32.sub (local.get $ip_len) (local.get $ihl)))
      (then (return (i32.const -1))))
    (drop (call $seek (i32.add (local.get $ihl) (i32.const 22))))
    (i32.sub (local.get $udp_len) (i32.const 8)))

  ;; The big-endian 16-bit word at $p.
  (func $be16 (param $p i32) (result i32)
    (i32.or (i32.shl (i32.load8_u (local.get $p)) (i32.const 8))
            (i32.load8_u offset=1 (local.get $p)))))
