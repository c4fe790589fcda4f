;; Consumes every frame at once.
(module
  (func (export "ash_handle") (param $frame_len i32) (result i32)
    (i32.const 0)))
