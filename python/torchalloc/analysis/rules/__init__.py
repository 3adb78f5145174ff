"""The rules: what the names in a log mean, and why a block lived as long as it did and what it was for.

- frames.py: Python frames as the log records them, and which belong to
  a library; roles.py: what a phase's name says the phase is;
- sites.py: a block's allocation site (its first user frame, or a
  stand-in such as "(no Python stack)");
- classify.py: the reasons (why a block was freed when it was) and their
  rules; categorize.py: the categories (what a block was for) and theirs;
- blocks.py: those rules applied block by block, per distinct stack and
  cached, for the second pass, and the facts of a block's future
  (`BIT_*`) that the first pass gathers for them.

Nothing here reads a log: the passes (passes/) hand the rules what they
read, and the sections (sections/) word what the rules say.
"""
