"""Packed runs: several runs of a sweep or a seeds group trained at once from one thread (`--pack K`): MLPs in
lanes of one group (lane_group, lane_slabs, lane_step), other models side by side (side_by_side), and
`--pack auto` (auto)."""
