"""The words that mark a standing request ("from now on"), a mention ("in my novel",
"for homework") and someone who passes an order on to the user ("my manager", "the
form"), in the languages users speak. Data only, one phrase a line, written as people
write it: :mod:`afterthought.validation` folds each phrase to its normalised view and
compiles it. Orders themselves, in any language, are the classifier's to read
(:mod:`afterthought.classifier`)."""

from __future__ import annotations

FUTURE = """
desde ya
cada vez que
chaque fois que
jedes mal
ogni volta che
sempre que
каждый раз
每次
毎回
매번
كل مرة
हर बार
her seferinde
de ahora en más
para la próxima
d'ora in avanti
for all our sessions
for all our chats
for all our conversations
for all future
in all sessions
every session
zukünftig
bei allen zukünftigen
a partir de hoy
desde hoy
a partir de hoje
desde hoje
dès aujourd'hui
à compter de maintenant
ab heute
da oggi
a partire da ora
с сегодняшнего дня
从今天起
从今以后
今日から
오늘부터
من اليوم
आज से
bugünden itibaren
from this point on
from today
upcoming conversations
upcoming chats
later chats
later conversations
next session
next conversation
next chat
future session
every future
from now on
next time
for the rest of our
in future sessions
in future chats
in future conversations
in all future
in all our future
in every future
going forward
henceforth
de ahora en adelante
a partir de ahora
desde ahora
la próxima vez
en las próximas
en adelante
en el futuro
el resto de nuestras
à partir de maintenant
désormais
dorénavant
la prochaine fois
à l'avenir
pour le reste de nos
lors des prochaines
ab jetzt
von nun an
ab sofort
künftig
in zukunft
beim nächsten mal
nächstes mal
für den rest unserer
in allen zukünftigen
d'ora in poi
da ora in poi
da adesso
la prossima volta
in futuro
per il resto delle nostre
nelle prossime
de agora em diante
a partir de agora
da próxima vez
na próxima vez
no futuro
no resto das nossas
nas próximas
с этого момента
отныне
теперь всегда
в следующий раз
в будущем
во всех будущих
в будущих
впредь
从现在开始
从现在起
今后
以后
下次
在以后的
在今后的
将来
これからは
今後
次に
次回
今から
以降
지금부터
앞으로
다음에
다음부터
이제부터
من الآن فصاعدا
من الآن
في المرة القادمة
في المستقبل
في المحادثات القادمة
अब से
अगली बार
भविष्य में
आगे से
bundan sonra
artık
bir dahaki sefere
gelecekte
sonraki sohbet
"""

MENTION_CUES = """
play
whisper
murmur
exclaim
explain
explic
erklär
spiega
объясн
解释
説明
설명
شرح
समझा
anlat
tradu
перевод
prompt
injection
inyección
attack
ataque
attaque
angriff
attacco
атак
攻击
注入
攻撃
インジェクション
인젝션
공격
هجوم
हमला
saldırı
frase
satz
ifade
cümle
عبارة
वाक्य
表現
표현
teacher
老师
先生
선생님
المعلم
शिक्षक
öğretmen
учител
aula
articol
artigo
exempl
esempi
ejemplo
пример
стать
scriv
escrev
escrib
écri
schreib
estud
studi
étudi
изуча
novel
story
stories
book
screenplay
script
character
villain
hero
npc
game
poem
song
film
movie
scene
says
said
say
saying
shouting
shouts
writes
wrote
written
typing
typed
translate
translation
homework
class
lesson
teacher
course
exam
article
news
paper
essay
thesis
report
reading
read
quote
quoting
cited
phrase
sentence
means
meaning
how do you say
example
like
such as
phishing
scam
joke
meme
sign
form
poster
learning
novela
cuento
historia
personaje
dice
dijo
frase
traducir
traduce
tarea
significa
aprendiendo
artículo
roman
histoire
personnage
dit
traduire
devoir
signifie
geschichte
figur
sagt
satz
übersetz
hausaufgabe
bedeutet
artikel
romanzo
personaggio
tradurre
compito
significa
romance
personagem
traduzir
роман
рассказ
персонаж
говорит
фраза
перевести
по-английски
статья
статьи
домашн
小说
故事
角色
翻译
作业
论文
引用
文章
意思
这句话
小説
物語
キャラ
叫ぶ
翻訳
宿題
論文
記事
意味
場面
소설
이야기
캐릭터
번역
숙제
기사
의미
رواية
قصة
ترجم
واجب
مقال
उपन्यास
कहानी
अनुवाद
roman
hikaye
çevir
ödev
makale
"""

REPORTERS = """
villain
hero
robot
character
hacker
attacker
scammer
pirate
npc
narrator
protagonist
article
post
prof
profe
maestro
maestra
manager
boss
teacher
professor
lecturer
doctor
mum
mom
dad
mother
father
wife
husband
colleague
coworker
friend
landlord
coach
supervisor
instructor
sister
brother
form
recipe
sign
manual
leaflet
letter
email
website
page
label
guide
memo
notice
handbook
document
doc
policy
contract
jefe
jefa
profesor
profesora
médico
formulario
receta
chef
professeur
médecin
formulaire
recette
chef
lehrer
lehrerin
arzt
formular
rezept
"""
