"""Generates the openreg PrivateUse1 registrations from backend_functions.yaml.

Pipeline: ``load`` reads and validates the yaml into the dataclasses of ``model``,
resolving every operator against torchgen's parsed ``native_functions.yaml``;
the emitters in ``emit`` turn that model into C++; ``cli`` writes the files.
"""
