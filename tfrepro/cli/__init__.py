"""The ``tfrepro`` command line: ``commands`` (the argument parser, one function per command, and
``main``, the console entry point), ``rendering`` (everything printed) and ``exit_codes`` (one enum).

The top of the house: it may import every other subpackage; nothing imports it.
"""
