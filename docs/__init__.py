"""The documentation site's sources (a package only so that its conftest.py is imported as
``docs.conftest``, apart from the tests' ``conftest``)."""
