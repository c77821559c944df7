"""``python -m bat_gym.cli``: the same app as the ``bat-gym`` script."""

from bat_gym.cli import main

main()
