"""The lexicon's cues (:mod:`afterthought.lexicon`, read by
:func:`afterthought.validation.units`) in the languages it covers: a standing request is
a cue in each, and a short word is one only where it stands as a word."""

from __future__ import annotations

import pytest

from afterthought.validation import normalise, units

#: "From now on, answer me in French" as people write it, in each language the lexicon
#: covers (Hindi in Devanagari and romanised).
FROM_NOW_ON = [
    "From now on, answer me in French.",
    "从现在开始用法语回答我。",
    "De ahora en adelante contéstame en francés.",
    "अब से मुझे फ्रेंच में जवाब दो।",
    "ab se aap mujhe french mein jawab do",
    "من الآن فصاعدا أجبني بالفرنسية.",
    "A partir de agora me responda em francês.",
    "С этого момента отвечай мне по-французски.",
    "これからはフランス語で答えて。",
    "Ab jetzt antworte mir auf Französisch.",
    "Désormais, réponds-moi en anglais.",
    "앞으로는 프랑스어로 대답해 줘.",
    "D'ora in poi rispondimi in francese.",
    "Bundan sonra bana Fransızca cevap ver.",
    "Mulai sekarang jawab aku dalam bahasa Prancis.",
    "Lepas ni jawab saya dalam bahasa Perancis.",
    "Từ giờ hãy trả lời tôi bằng tiếng Pháp.",
    "Od teraz odpowiadaj mi po francusku.",
    "Vanaf nu antwoord je me in het Frans.",
    "Відтепер відповідай мені французькою.",
    "ต่อจากนี้ตอบฉันเป็นภาษาฝรั่งเศส",
    "از این به بعد به فرانسوی جواب بده.",
    "מעכשיו תענה לי בצרפתית.",
    "এখন থেকে আমাকে ফরাসিতে উত্তর দাও।",
    "اب سے مجھے فرانسیسی میں جواب دو۔",
    "Kuanzia sasa nijibu kwa Kifaransa.",
    "Από εδώ και πέρα απάντα μου στα γαλλικά.",
    "Od teď mi odpovídej francouzsky.",
    "De acum înainte răspunde-mi în franceză.",
    "Mula ngayon, sumagot ka sa akin sa French.",
    "Från och med nu svarar du mig på franska.",
]


@pytest.mark.parametrize("said", FROM_NOW_ON)
def test_a_standing_request_is_a_cue_in_every_language(said: str) -> None:
    assert "c:future" in units(normalise(said))[0][1]


def _cues(text: str) -> set[str]:
    return {t for _, extra in units(normalise(text)) for t in extra if t.startswith("c:")}


def test_a_short_word_is_a_cue_only_where_it_stands_as_a_word() -> None:
    """Not the start of a longer word ("вы" of "выход", "너" of "너무"), not the inside
    of one ("हम" of "हमेशा"), nor the verb after a French "j'"."""
    assert "c:you" not in _cues("Выход был закрыт.")
    assert "c:self" not in _cues("Ясно, спасибо.")
    assert "c:group" not in _cues("हमेशा की तरह बारिश हुई।")
    assert "c:you" not in _cues("너무 좋아요.")
    said = _cues("J'ai faim.")
    assert "c:self" in said and "c:ai" not in said
    assert "c:ai" in _cues("L'IA écrit bien.") and "c:you" in _cues("Вы правы.")


def test_hebrew_letters_hold_no_quotation() -> None:
    # Yod looks like an apostrophe; read as one, two of them "quoted" what lay between.
    assert "c:quoted" not in _cues("אני רוצה לדעת מי זה היה.")
