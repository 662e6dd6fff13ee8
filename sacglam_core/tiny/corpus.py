"""The text the pre-trained tiny LM learns language from: general knowledge of the environment's words and of
following an instruction, and no solution of the task.

A synthetic corpus from templates, seeded, so that the build is reproducible and its rules can be checked:
- taxonomy: which type is an animal, a plant, a piece of furniture or a supply, and what a living_thing is;
- colours, and objects named by colour;
- what makes things grow and how things are carried, in prose (water grows plants and animals, food grows
  animals, furniture never grows, a hand holds at most two things);
- definitions of the verbs and words the goals use (grasp, grow, go to, release, then, any);
- scenes described in other formats than the environment's (a room's contents, an inventory, a shelf);
- selection tasks from other domains (kitchen, tools, fruit... and made-up kinds of made-up objects): an
  instruction, the options in view, where one stands, what one holds, and the move, which names one of them.

What it never holds (tests/test_corpus.py checks each line): the environment's prompt (its `Goal:`, `You see:`,
`Action:` lines...), an action or goal string naming one of the environment's objects (`go to red dog`,
`grasp any animal`, `grow blue cat`), so no trajectory, no reward-derived label and no recipe written in the
environment's action strings.
"""

from __future__ import annotations

import random

from sacglam_core.envs.objects import CATEGORIES, COLORS, TYPES

CATEGORY_PHRASE = {"animal": "an animal", "plant": "a plant", "furniture": "a piece of furniture", "supply": "a supply"}
OTHER_COLORS = ("yellow", "black", "white", "orange", "purple", "grey")
DOMAINS: dict[str, tuple[str, ...]] = {  # other domains' objects, never the environment's
    "kitchen": ("cup", "fork", "plate", "spoon", "bowl", "kettle", "knife", "jar"),
    "tools": ("hammer", "saw", "drill", "wrench", "ladder", "brush", "rope", "bucket"),
    "vehicles": ("car", "bus", "bike", "boat", "truck", "scooter", "van", "tractor"),
    "clothes": ("hat", "shoe", "coat", "scarf", "sock", "glove", "shirt", "belt"),
    "fruit": ("apple", "banana", "pear", "plum", "lemon", "cherry", "grape", "melon"),
    "office": ("pen", "stapler", "folder", "envelope", "notebook", "ruler", "eraser", "clip"),
    "music": ("guitar", "drum", "violin", "flute", "piano", "trumpet", "harp", "banjo"),
    "sport": ("ball", "racket", "bat", "helmet", "net", "skate", "kite", "puck"),
    "toys": ("doll", "robot", "puzzle", "yoyo", "marble", "teddy", "block", "whistle"),
    "jewels": ("ring", "necklace", "bracelet", "earring", "brooch", "crown", "pendant", "locket"),
    "devices": ("phone", "radio", "camera", "laptop", "clock", "speaker", "tablet", "charger"),
    "vegetables": ("carrot", "potato", "onion", "cabbage", "pepper", "turnip", "leek", "radish"),
    "containers": ("box", "basket", "bag", "crate", "barrel", "bottle", "tin", "sack"),
}
PLACES = ("room", "garden", "kitchen", "garage", "yard", "shop", "field", "hall")
TASK_VERBS = ("grasp", "take", "fetch", "pick up", "find", "bring me", "get", "hold", "collect", "grab")
DOMAIN_NAME = {
    "kitchen": "utensil", "tools": "tool", "vehicles": "vehicle", "clothes": "garment", "fruit": "fruit",
    "office": "stationery", "music": "instrument", "sport": "sports_gear", "toys": "toy", "jewels": "jewel",
    "devices": "device", "vegetables": "vegetable", "containers": "container",
}  # fmt: skip


ONSETS = tuple("b bl br d dr f fl g gl gr k kl m n p pl pr sn st t tr v w z".split())
VOWELS = tuple("a e i o u oo ai ee".split())
CODAS = tuple("b ck d f g k l m mp n nk p sh t x zz".split())


def nonce_domains(rng: random.Random, count: int = 48, size: int = 8) -> dict[str, tuple[str, ...]]:
    """Made-up kinds of made-up objects (`blick`, `zoomp`): with so many names the selection tasks can only be
    learnt by reading the options, not by remembering which objects answers name."""
    taken = set(TYPES) | {o for objects in DOMAINS.values() for o in objects} | set(DOMAIN_NAME.values())
    words: list[str] = []
    while len(words) < count * (size + 1):
        word = "".join(rng.choice(part) for part in (ONSETS, VOWELS, CODAS)) + rng.choice(("", "", "o", "er", "y"))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return {words[i * (size + 1)]: tuple(words[i * (size + 1) + 1 : (i + 1) * (size + 1)]) for i in range(count)}


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def taxonomy(rng: random.Random) -> list[str]:
    lines = []
    for category, types in CATEGORIES.items():
        phrase = CATEGORY_PHRASE[category]
        for type_ in types:
            lines += [f"{article(type_)} {type_} is {phrase}.", f"the {type_} is {phrase}."]
            if category in ("animal", "plant"):
                lines += [f"{article(type_)} {type_} is a living_thing.", f"every {type_} is alive."]
            else:
                lines.append(f"{article(type_)} {type_} is not a living_thing.")
            other = rng.choice([c for c in CATEGORIES if c != category])
            lines += [f"is {article(type_)} {type_} {CATEGORY_PHRASE[other]}? no.", f"is the {type_} {phrase}? yes."]
        for _ in range(6):
            a, b, c = rng.sample(types, 3) if len(types) >= 3 else (*types, types[0])
            lines.append(f"examples of {category}: {a}, {b} and {c}.")
    lines += [
        "animals and plants are living things: each of them is a living_thing.",
        "furniture and supplies are not living things.",
        "food and water are supplies.",
    ]
    for domain, objects in DOMAINS.items():
        for obj in objects:
            lines.append(f"{article(obj)} {obj} belongs to the {domain}.")
    return lines


def colours(rng: random.Random) -> list[str]:
    lines = [f"{c} is a colour." for c in (*COLORS, *OTHER_COLORS)]
    objects = list(TYPES) + [o for objects in DOMAINS.values() for o in objects]
    for _ in range(600):
        colour, obj = rng.choice(COLORS + OTHER_COLORS), rng.choice(objects)
        lines.append(
            rng.choice(
                [
                    f"the {colour} {obj} is {colour}.",
                    f"{article(colour)} {colour} {obj} is {article(obj)} {obj} that is {colour}.",
                    f"this {obj} is {colour}, so it is {article(colour)} {colour} {obj}.",
                ]
            )
        )
    return lines


def affordances(rng: random.Random) -> list[str]:
    lines = [
        "living things grow. furniture does not grow. supplies do not grow.",
        "a plant needs water to grow.",
        "an animal grows when it eats food or drinks water.",
        "water makes plants and animals bigger.",
        "food makes animals bigger, but plants do not eat food.",
        "when water meets a plant, the plant grows.",
        "when food meets an animal, the animal grows.",
        "a hand can hold two things at most.",
        "you can carry what you hold wherever you walk.",
        "to hold a thing, you must first be where it is.",
        "when you let go of a thing, it stays where you are.",
    ]
    for type_ in CATEGORIES["plant"]:
        lines += [f"the {type_} grows with water.", f"a {type_} does not eat food."]
    for type_ in CATEGORIES["animal"]:
        lines += [f"the {type_} grows when it eats food.", f"the {type_} grows when it drinks water."]
    for type_ in CATEGORIES["furniture"]:
        lines += [f"{article(type_)} {type_} never grows.", f"you can carry {article(type_)} {type_}."]
    return lines * 3


def definitions() -> list[str]:
    lines = [
        "to grasp a thing is to take it and hold it.",
        "grasp means take hold of.",
        "to grow is to become bigger.",
        "grow means become bigger.",
        "to release a thing is to let go of it.",
        "release means let go.",
        "to go to a place is to walk there.",
        "then means after that.",
        "do this then that: first this, after that that.",
        "any means one of them, whichever you like.",
        "nothing means not one thing.",
        "holding a thing means keeping it in your hand.",
    ]
    return lines * 5


def scene(rng: random.Random, objects: list[str], n: int) -> list[str]:
    return [f"{rng.choice(COLORS + OTHER_COLORS)} {o}" for o in rng.sample(objects, n)]


def scenes(rng: random.Random) -> list[str]:
    env_objects = list(TYPES)
    lines = []
    for _ in range(800):
        things = scene(rng, env_objects + [o for objs in DOMAINS.values() for o in objs], rng.randint(2, 5))
        listed = ", ".join(things[:-1]) + f" and {things[-1]}"
        place = rng.choice(PLACES)
        lines.append(
            rng.choice(
                [
                    f"in the {place} there are {listed}.",
                    f"the {place} holds: {listed}.",
                    f"inventory of the {place}: {'; '.join(things)}.",
                    f"on the shelf: {listed}. nothing else.",
                ]
            )
        )
    return lines


INSTRUCTION = ("goal", "request", "task", "instruction", "mission", "aim", "objective", "order")
IN_VIEW = ("in view", "nearby", "around", "options", "visible", "on the shelf", "you notice", "you can see", "you spot")
IN_HAND = ("in hand", "carrying", "held", "now holding", "you carry", "you are carrying", "in your hands")
STANDING = ("on", "standing on", "standing at", "next to", "you stand on", "you are at", "you are next to")
ANSWER = ("action", "move", "next", "answer", "do", "step", "choice", "reply")
DONE = ("done so far", "finished", "made so far", "you have made", "you have finished", "you have done")


def state_fields(rng: random.Random, standing: str, holding: str) -> str:
    """Where one stands (always), then, in a random order, what one holds (always when it is something) and what
    is done so far."""
    held = holding != "nothing" or rng.random() < 0.7
    extra = [f"{rng.choice(IN_HAND)}: {holding}."] * held + [f"{rng.choice(DONE)}: nothing."] * (rng.random() < 0.5)
    rng.shuffle(extra)
    return " ".join([f"{rng.choice(STANDING)}: {standing}.", *extra])


def wanted(rng: random.Random, options: list[str], kinds: dict[str, str]) -> tuple[str, list[str]]:
    """An instruction's object phrase and the options it describes: one thing, any of a type, of a colour, or of a
    domain's kind (`kinds`: option -> the name of its domain's kind)."""
    target = rng.choice(options)
    colour, kind = target.split()
    form = rng.random()
    if form < 0.4:
        return rng.choice([f"the {target}", target]), [target]
    if form < 0.65:
        return f"any {kind}", [o for o in options if o.split()[1] == kind]
    if form < 0.8 and colour not in COLORS:  # `any red thing` after `grasp` is one of the environment's goals
        return f"any {colour} thing", [o for o in options if o.split()[0] == colour]
    return f"any {kinds[target]}", [o for o in options if kinds[o] == kinds[target]]


# The share of selection tasks answered by a move drawn at random among those the line allows: without such slips
# the model put 80-90% of its mass on one action in the environment (entropy 0.12-0.33 of uniform's, docs/prior.md).
SLIPS = 0.65


def selection_tasks(rng: random.Random) -> list[str]:
    """Instructions from other domains, the options in view, and the move that follows the instruction, in
    varied formats (the words that mark each part change from line to line)."""
    nonce = nonce_domains(rng)
    domains = {**DOMAINS, **nonce}
    kind_name = {**DOMAIN_NAME, **{name: name for name in nonce}}
    lines = []
    for _ in range(12000):
        picked = rng.sample(list(DOMAINS), 2) if rng.random() < 0.5 else rng.sample(list(nonce), 2)
        options = scene(rng, list(domains[picked[0]]), rng.randint(2, 4)) + scene(
            rng, list(domains[picked[1]]), rng.randint(1, 3)
        )
        rng.shuffle(options)
        kinds = {o: kind_name[next(d for d in picked if o.split()[1] in domains[d])] for o in options}
        phrase, matching = wanted(rng, options, kinds)
        target = rng.choice(matching)
        ask = f"{rng.choice(INSTRUCTION)}: {rng.choice(TASK_VERBS)} {phrase}."
        kind = rng.random()
        if kind < 0.8:  # standing elsewhere: go to what the instruction wants
            standing = rng.choice([*[o for o in options if o not in matching], "nothing"])
            view, state, move = options, state_fields(rng, standing, "nothing"), f"go to {target}"
            moves = [f"go to {o}" for o in options if o != standing] + ["grasp"] * (standing != "nothing")
        elif kind < 0.9 and len(options) - len(matching) >= 2:  # both hands full of other things: free one first
            held = rng.sample([o for o in options if o not in matching], 2)
            view = [o for o in options if o not in held]
            state, move = state_fields(rng, "nothing", f"{held[0]}, {held[1]}"), f"release {held[0]}"
            moves = [f"go to {o}" for o in view] + [f"release {h}" for h in held]
        else:  # standing on what the instruction wants: take it
            view = [o for o in options if o != target]
            state, move = state_fields(rng, target, "nothing"), "grasp"
            moves = [f"go to {o}" for o in view] + ["grasp"]
        if rng.random() < SLIPS:
            move = rng.choice(moves)
        lines.append(f"{ask} {rng.choice(IN_VIEW)}: {', '.join(view)}. {state} {rng.choice(ANSWER)}: {move}.")
        if rng.random() < 0.4:  # fields on lines of their own, as in many formats: no full stop between them
            lines[-1] = lines[-1].replace(". ", " ")
    return lines


def corpus(seed: int = 0) -> list[str]:
    """Every line of the pre-training corpus, shuffled with `seed`."""
    rng = random.Random(seed)
    lines = taxonomy(rng) + colours(rng) + affordances(rng) + definitions() + scenes(rng) + selection_tasks(rng)
    rng.shuffle(lines)
    return lines
