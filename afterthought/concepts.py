"""What a question about the user's life is asked in, and what the answer is said in.

People ask "what's my pup's name?" of a statement that says "Cannoli (our dog) knocked a
glass over", and "where am I based these days?" of "we finally moved to Montreal": the
words of the question are not those of the answer, and a lexical index finds nothing
without a bridge. Each concept here is one everyday topic of a personal history: the words
that ask about it, and the words a statement about it is commonly said with. A question
holding an asking word is also ranked by the saying words (``retrieval.expansion_terms``).

Data only, general English, one concept per entry; words are matched as the index reads
them (stemmed, case and accents folded), a phrase as a phrase."""

from __future__ import annotations

#: Where the user lives.
HOME = (
    "live living home city town based address neighbourhood neighborhood relocate"
    " relocated move moved packed country",
    "live lived living moved move relocation relocated settled flat apartment house"
    " rent unpacking here",
)
#: Work.
WORK = (
    "work working job employer company career office employed hired profession"
    " living colleague salary firm pays",
    "work job start started offer onboarding hired company office role position"
    " promoted colleagues boss shift",
)
#: Cars and driving.
CARS = (
    "car cars drive driving driver vehicle licence license insurance parking",
    "car drive driving sold bought traded wheels secondhand test",
)

#: (asking words, saying words) per concept.
CONCEPTS: tuple[tuple[str, str], ...] = (
    HOME,
    WORK,
    # Pets.
    (
        "pet pets pup puppy dog doggy cat kitty kitten moggy rodent bird animal vet"
        " four-legged furry feathered shelled fish hamster rabbit bunny lizard reptile"
        " snake tortoise turtle",
        "dog cat puppy kitten hamster rabbit bunny parrot budgie canary ferret tortoise"
        " turtle lizard gecko snake fish goldfish gerbil chinchilla hedgehog guinea pig"
        " vet adopted shelter pet",
    ),
    # Food, drink and what the user cannot have.
    (
        "eat food menu dessert dinner meal restaurant potluck recipe cook cooking snack"
        " breakfast lunch drink drinks bar toast wine beer cocktail order cafe cafe"
        " safely",
        "allergic allergy intolerant intolerance vegan vegetarian gluten coeliac celiac"
        " lactose dairy nuts teetotal sober alcohol diet halal kosher",
    ),
    # Health and the body.
    (
        "health hike hiking winter cold outdoor outdoors skating ski skiing exercise"
        " sport pack mountains",
        "condition diagnosed asthma arthritis migraine knee back injury cold fingers"
        " allergy allergic",
    ),
    # Travel.
    (
        "trip travel travelling traveling holiday vacation abroad flight fly weekend getaway visit",
        "flying fly plane flight travel trip holiday passport visa seasick",
    ),
    # Family.
    (
        "family kids children child son daughter parent parents father mother",
        "kids children son daughter twins baby toddler wife husband partner family dad mum mom",
    ),
    # The home itself.
    (
        "table hosting furniture guests sofa space room suit apartment flat house",
        "studio flat apartment small tiny garden house room bedroom",
    ),
    # Learning.
    (
        "language languages tongue learning picking study studying course",
        "learning lessons speak fluent teacher pronunciation vocabulary grammar",
    ),
    # Reading.
    (
        "novels novel books book author authors writer writers read reading",
        "reading rereading novel book author",
    ),
    # Sport teams.
    ("club team fan support supporter football soccer match", "support fan season match team"),
    # Music.
    (
        "instrument practice music musical play playing band keyboard",
        "piano guitar violin viola drums cello flute trumpet trombone saxophone clarinet"
        " ukulele harp bass practice lessons",
    ),
    # Studies.
    (
        "university college school degree course project thesis study studies exam",
        "dissertation thesis degree exam exams graduated graduation course essay",
    ),
    # Appointments.
    (
        "appointment optician doctor dentist clinic hospital checkup scan",
        "appointment eye test dentist doctor scan check",
    ),
    # Races and events entered.
    ("race 5k 10k 21k 42k marathon", "marathon half race 10k 5k"),
    # Speaking and performing.
    (
        "speaker speaking speech talk presentation debut perform performance stage",
        "talk conference presentation speech gig stage",
    ),
    # Gardening.
    ("garden plot gardening grow growing", "allotment garden plot vegetables"),
    # Official papers.
    (
        "ceremony citizenship naturalisation naturalization passport visa papers",
        "citizenship ceremony passport visa residency",
    ),
    # What advice to the user must respect: asked for advice, the block should hold
    # what limits it (a fear, an injury, a diet, the hours they keep, who comes along).
    (
        "suggest recommend recommendation plan tips advice ideas idea best good schedule book",
        "allergic allergy intolerant fear terrified afraid phobia injury physio knee"
        " ankle shoulder back shifts twins teetotal sober vegan vegetarian condition"
        " diagnosed pregnant",
    ),
    # Where the user grew up.
    (
        "raised grow grew childhood born hometown upbringing",
        "grew up born childhood raised",
    ),
    CARS,
    # Coffee, tea and other daily habits.
    ("caffeine coffee tea drinks cups", "coffee coffees espresso tea cups caffeine"),
    # Hobbies.
    (
        "pastime pastimes hobby hobbies interests free time spare weekend activity",
        "hobby hobbies obsession obsessions signed took club",
    ),
    # Exercise routines.
    (
        "mileage running run distance pool swim swimming gym weekly routine workout",
        "km miles lengths laps running swimming gym week",
    ),
)

#: The user's facts that change, each with the concept that asks about it: a question
#: about how things were before a change ("which city did I live in before the move?")
#: is shown the statements its topic's changed facts were read from, the old value's and
#: the new one's, whatever words they were said in ("we rent a place in Porto, ten minutes
#: from the river" shares none with the question).
CHANGING: tuple[tuple[str, tuple[str, str]], ...] = (
    ("lives_in", HOME),
    ("works_at", WORK),
    ("occupation", WORK),
    ("car", CARS),
)
