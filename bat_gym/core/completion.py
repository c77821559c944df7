"""The env's action: an assistant message, optionally with its generated token count.

Its own module, below both the env and the policies that produce it, so that a policy
needs nothing of the env to say how many tokens it spent.
"""

from __future__ import annotations

__all__ = ["Completion"]


class Completion(str):
    """An assistant message that also carries how many tokens the policy generated.

    Pass it to ``step`` instead of a plain ``str`` to count against the response-token
    budget; any other ``str`` is counted with the env's ``token_counter``, if given.
    """

    num_tokens: int | None

    def __new__(cls, text: str, num_tokens: int | None = None) -> Completion:  # noqa: D102
        obj = super().__new__(cls, text)
        obj.num_tokens = num_tokens
        return obj
