"""How rounds are run: in the calling process (`run_round`), or served (`dyngen serve`:
Prefect's runner, or children forked from a warm process), and how those processes end.

What a round is and needs before its stages (admission, the inbox's batch ends it
covers) is in dyngen.round; the round's flow itself is dyngen.flows.generation_round.
"""
