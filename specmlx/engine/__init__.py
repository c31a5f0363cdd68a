"""The engine floor: THE verify loop and everything it runs on.

`decode` (propose -> verify once -> accept -> rewind -> yield), the step contract a drafter
keeps (`step`: Plan, Draft, Verdict, Step, DrafterTraits, the Drafter protocol), the pure acceptance
rules (`verify`), warping and drawing (`sampling`), the target's cache with rewind for every
cache kind (`cache`), token trees (`tree`), hidden-state capture (`features`), where a
model keeps its sizes and output layer (`anatomy`), the cost model (`costs`), the policies
that choose k (`policy/`), running statistics (`stats`) and what the device is (`device`). It imports only mlx, mlx-lm, itself and `specmlx.errors`:
every floor above may use it, it uses none of them.
"""
