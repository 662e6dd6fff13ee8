"""Objects of Playground-Text: categories, types, colors and the 96 object kinds they make."""

from __future__ import annotations

from dataclasses import dataclass

COLORS: tuple[str, ...] = ("red", "blue", "green")

CATEGORIES: dict[str, tuple[str, ...]] = {
    "animal": ("dog", "cat", "chameleon", "human", "fly", "parrot", "mouse", "lion", "pig", "cow"),
    "plant": ("cactus", "carnivorous", "flower", "tree", "bush", "grass", "algae", "tea", "rose", "bonsai"),
    "furniture": ("door", "chair", "desk", "lamp", "table", "cupboard", "sink", "window", "sofa", "carpet"),
    "supply": ("food", "water"),
}
LIVING_CATEGORIES = ("animal", "plant")
# Goal-language names: every type, then the category names with the derived `living_thing`.
CATEGORY_NAMES: tuple[str, ...] = ("animal", "plant", "furniture", "living_thing", "supply")
TYPES: tuple[str, ...] = tuple(t for types in CATEGORIES.values() for t in types)
NAMES: tuple[str, ...] = TYPES + CATEGORY_NAMES


@dataclass(frozen=True)
class ObjectKind:
    """One `<color> <type>` combination; `index` is its position in `KINDS`."""

    index: int
    color: str
    type: str
    category: str

    @property
    def name(self) -> str:
        return f"{self.color} {self.type}"

    @property
    def is_living(self) -> bool:
        return self.category in LIVING_CATEGORIES

    def has_name(self, name: str) -> bool:
        """Whether the goal-language `name` (a type or a category name) describes this object."""
        return name in (self.type, self.category) or (name == "living_thing" and self.is_living)

    def grows_with(self, supply: ObjectKind) -> bool:
        """Water grows every living thing; food grows animals only."""
        if supply.type == "water":
            return self.is_living
        return supply.type == "food" and self.category == "animal"


KINDS: tuple[ObjectKind, ...] = tuple(
    ObjectKind(i, color, type_, category)
    for i, (category, type_, color) in enumerate(
        (category, type_, color) for category, types in CATEGORIES.items() for type_ in types for color in COLORS
    )
)
KIND_BY_NAME: dict[str, ObjectKind] = {kind.name: kind for kind in KINDS}
