"""What the household's facts cost, and how much of the prompt a household shares.

A household of four (an owner, two members, a guest), each with their own facts, and 8 facts of
the household's, at windows 4,096, 8,192 and 32,768. Printed, from roost's own blocks (the pure
functions the turn uses, no model):

* the `<household_facts>` block's estimated tokens against its cap (window / 32), beside the
  person's own block;
* the leading bytes the owner's and a member's system messages share (what one Ollama's prompt
  cache can reuse between their conversations), roost's order (the household's block before the
  person's) against a baseline in the same run that puts it after the person's facts;
* the guest's system message: whether any household fact is in it (target: none).

Run from the repository root: `python bench/household_facts.py`.
"""

from __future__ import annotations

import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.automation_prefix import shared_bytes
from daemon.context.facts import facts_block, with_facts
from daemon.context.prefix import MemoryMap, system_prefix

HOUSEHOLD = [(f"2026-11-0{n + 1}", text) for n, text in enumerate((
    "The wifi password is plum-tree-42", "The bins go out on Tuesday evening",
    "Grandma visits every second Sunday", "The car is due for its service in March",
    "Omar is allergic to peanuts, so no peanut butter in shared meals",
    "The spare key is with the neighbours at number 12", "Dinner is at 19:00 on weekdays",
    "The cat is called Pickle and eats twice a day"))]
OWN = {
    "owner": [("2026-11-10", "My locker code is 4417"), ("2026-11-11", "I prefer metric units")],
    "member": [("2026-11-12", "My bike lock is 9032"), ("2026-11-13", "I study chemistry")],
    "guest": [("2026-11-14", "My hotel room is 5518")],
}
WINDOWS = (4096, 8192, 32768)


def system_message(shared: str, own: str, household: str, *, household_first: bool) -> str:
    blocks = (household, own) if household_first else (own, household)
    return with_facts(shared, "\n\n".join(b for b in blocks if b))


def main() -> None:
    shared = system_prefix(capabilities=(), memory=MemoryMap(day=date(2026, 12, 5)),
                           variables={}, tools=True)
    print("household facts: 8; the owner 2 own facts, a member 2, the guest 1\n")
    print("Tokens: the household's block against its cap, and the owner's own block. Bytes the "
          "owner's and a member's\nsystem messages share: roost's order (household first) "
          "against the baseline (after the person's).\n")
    print("   window  household  cap  own   shared: roost  baseline  ratio  guest sees one")
    for window in WINDOWS:
        household = facts_block(HOUSEHOLD, window, household=True)
        own = {who: facts_block(facts, window) for who, facts in OWN.items()}
        shares = []
        for first in (True, False):
            owner = system_message(shared, own["owner"].text, household.text,
                                   household_first=first)
            member = system_message(shared, own["member"].text, household.text,
                                    household_first=first)
            shares.append(shared_bytes(owner.encode(), member.encode()))
        guest = system_message(shared, own["guest"].text, "", household_first=True)
        leaked = any(text in guest for _, text in HOUSEHOLD)
        print(f"   {window:>6,}  {household.tokens:>9}  {household.cap:>4}  "
              f"{own['owner'].tokens:>3}  {shares[0]:>13,}  {shares[1]:>8,}  "
              f"x{shares[0] / shares[1]:.2f}  {'yes' if leaked else 'no':>13}")
    print(f"\n(the shared part alone: {len(shared.encode()):,} bytes; roost's order lets the "
          "owner and every member share it and the household's block)")


if __name__ == "__main__":
    main()
