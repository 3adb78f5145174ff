"""The two passes over a log read in pieces, and the hooks through which they feed the sections.

- pieces.py: one device's events piece by piece as columns, and blocks
  paired across pieces (both passes pair the same way);
- first.py: the first pass, `scan` -> `Scan`, the facts the second needs
  (first_state.py: what it carries from one piece to the next);
- second.py: the second pass, `run_pass` -> `Passed`: each block's site,
  category and reason, the timeline's per-phase curves, and the blocks
  live at the moments the report shows (moments.py says which; details.py
  what a shown block's details are);
- follow.py: `Follower`, the hooks the second pass calls on each
  section's follower, piece by piece; ranges.py: which address range held
  an address when, which followers ask.

The passes name no section: a section's module (sections/) declares its
follower and the moments it needs, and `analyze` (front.py) hands the
pass the followers of every registered section.
"""
