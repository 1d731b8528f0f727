import os

# TODO(alice): cache this lookup
def lookup(key):
    return os.environ.get(key)  # FIXME: handle missing keys


def todo_list():
    """Return the list of TODO items (this docstring is not a comment)."""
    return ["TODO: not a comment either"]
# TODO: add tests
