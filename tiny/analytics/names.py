"""Whale names: a stable, memorable ``adjective_animal`` for an ip_id on a day."""

from __future__ import annotations

import hashlib

# fmt: off
_ADJECTIVES = (
    "agile", "amber", "ancient", "breezy", "bold", "brave", "bright", "brisk", "bubbly", "calm",
    "candid", "cheerful", "chilly", "clever", "cloudy", "colossal", "cosmic", "cozy", "crimson", "crisp",
    "curious", "curly", "daring", "dapper", "dazzling", "eager", "early", "electric", "elegant", "emerald",
    "fancy", "fearless", "feisty", "fierce", "fluffy", "flying", "foggy", "frosty", "fuzzy", "gentle",
    "giant", "giddy", "gleaming", "golden", "graceful", "grumpy", "happy", "hasty", "hidden", "humble",
    "hungry", "icy", "jolly", "jumpy", "keen", "kind", "lively", "lucky", "lunar", "majestic",
    "merry", "mighty", "misty", "modest", "nimble", "noble", "odd", "patient", "peppy", "plucky",
    "polite", "proud", "quick", "quiet", "quirky", "rapid", "relieved", "restless", "rosy", "rusty",
    "salty", "sandy", "serene", "shiny", "shy", "silent", "silly", "silver", "sleepy", "slick",
    "snowy", "solar", "sparkly", "speedy", "spicy", "spotted", "steady", "stormy", "striped", "sunny",
    "swift", "tidy", "tiny", "tireless", "velvet", "vivid", "wandering", "wild", "windy", "wise",
    "witty", "zany", "zesty", "freezing", "jazzy", "lofty", "mellow", "nifty", "perky", "rowdy",
)
_ANIMALS = (
    "aardvark", "albatross", "alpaca", "antelope", "armadillo", "badger", "barracuda", "beaver", "bison", "bobcat",
    "buffalo", "camel", "capybara", "caribou", "cheetah", "chicken", "chinchilla", "cobra", "condor", "cougar",
    "coyote", "crane", "cricket", "dingo", "dolphin", "donkey", "dove", "dragonfly", "eagle", "eel",
    "elephant", "elk", "falcon", "ferret", "finch", "flamingo", "fox", "frog", "gazelle", "gecko",
    "gerbil", "giraffe", "gnu", "goat", "gopher", "gorilla", "grouse", "hamster", "hare", "hedgehog",
    "heron", "hippo", "hornet", "hyena", "ibex", "iguana", "impala", "jackal", "jaguar", "jellyfish",
    "kangaroo", "kiwi", "koala", "lemur", "leopard", "lion", "llama", "lobster", "lynx", "magpie",
    "manatee", "marmot", "meerkat", "mole", "mongoose", "moose", "narwhal", "newt", "ocelot", "octopus",
    "okapi", "orca", "ostrich", "otter", "owl", "panda", "panther", "parrot", "pelican", "penguin",
    "pony", "porcupine", "puffin", "puma", "quail", "rabbit", "raccoon", "raven", "reindeer", "salamander",
    "seal", "shark", "sloth", "snake", "sparrow", "squid", "squirrel", "stork", "swan", "tapir",
    "tiger", "toucan", "turtle", "urchin", "vulture", "walrus", "weasel", "whale", "wombat", "zebra",
)
# fmt: on


def whale_name(date: str, ip_id: int) -> str:
    """A stable, memorable ``adjective_animal`` name for an ip_id on a date.

    A hash of ``"<date>/<ip_id>"`` (blake2b, not Python's salted ``hash``), so every process
    and every run gives the same name. Names are not unique: two ip_ids of a day may share one.
    """
    digest = int.from_bytes(hashlib.blake2b(f"{date}/{ip_id}".encode(), digest_size=8).digest(), "big")
    adjective = _ADJECTIVES[digest % len(_ADJECTIVES)]
    animal = _ANIMALS[(digest // len(_ADJECTIVES)) % len(_ANIMALS)]
    return f"{adjective}_{animal}"
