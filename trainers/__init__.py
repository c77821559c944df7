"""Trainers that consume bat_gym environments only through ``reset``/``step``."""
