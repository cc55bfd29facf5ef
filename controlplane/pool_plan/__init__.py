"""The capacity plan served by the API: the same pure function and record `lifeline pool plan` uses.

Nothing is stored: the plan is a function of its inputs (`warm_pool/capacity.py`),
so the console, an operator's script and the CLI get the same numbers and
the same arithmetic lines for the same inputs.
"""
