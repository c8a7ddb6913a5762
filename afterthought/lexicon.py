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
titled
entitled
subject line
with the subject
polish
proofread
rephrase
reword
rewrite
draft
does that sound
does this sound
corrige
revisa
korrigier
überarbeite
correggi
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
przetłumacz
tłumacz
dịch
terjemah
vertaal
översätt
переклад
"""

REPORTERS = """
daughter
son
kid
grandma
grandpa
granny
aunt
uncle
cousin
neighbour
neighbor
partner
girlfriend
boyfriend
roommate
flatmate
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

#: The one spoken to as "you", in the languages users speak: with :data:`ASSISTANT`, whom
#: a clause addresses (an order to the agent says "you"; a story or a report says "she").
YOU = """
you
your
yours
yourself
u
ur
tu
ti
usted
ustedes
vous
votre
toi
ton
du
dich
dir
dein
deine
deinen
jij
jou
jouw
ty
ciebie
cie
tobie
twoj
twoje
sen
seni
sana
senin
kamu
anda
kau
tum
tumhe
aap
voce
teu
tua
tuo
ты
тебя
тебе
твой
твои
вы
вас
вам
ваш
ти
твоє
你
您
あなた
君
お前
너
네가
당신
니가
أنت
انت
لك
تو
شما
אתה
לך
คุณ
เธอ
आप
तुम
"""

#: Words that name the agent itself (or its makers' settings) rather than a person.
ASSISTANT = """
assistant
ai
bot
chatbot
model
llm
gpt
system
agent
asistente
assistente
asystent
assistent
asisten
ia
ki
ии
бот
ассистент
помощник
助手
助理
人工智能
アシスタント
ボット
어시스턴트
챗봇
المساعد
ذكاء اصطناعي
trợ lý
yapay zeka
सहायक
"""

#: The speaker as the subject ("I", "my"): what people say about their own life.
SELF = """
i
i'm
im
my
me
je
j'
moi
mon
ma
ich
mein
meine
mir
mich
yo
mi
eu
meu
minha
io
mio
ik
mijn
ja
moj
moja
jag
min
ben
benim
aku
saya
mình
tôi
я
мой
моя
мне
меня
我
私
僕
나
내가
저
제가
أنا
من
אני
ฉัน
मैं
मेरा
मेरी
"""

#: Words that turn a message to a new matter ("btw", "anyway", "oh and"): a clause starts
#: after them, as after a full stop.
TURNS = """
btw
by the way
anyway
anyways
oh and
oh also
also
plus
ps
p.s.
por cierto
au fait
à propos
übrigens
кстати
а ещё
对了
顺便
ところで
あと
그리고
아 그리고
trouwens
oh iya
à mà
ว่าแต่
a propósito
aliás
comunque
tra l'altro
"""

#: Verbs said to the agent as orders (imperatives, "you are now"): a cue the classifier
#: weighs with whom the clause addresses, not a rule by itself ("I ignored my alarm").
ORDERS = """
ignore
disregard
forget
reveal
show me your
print your
repeat your
pretend
act as
never mention
don't mention
do not mention
don't tell
never tell
stop warning
always recommend
reply with
respond with
answer only
you are now
you're now
stay in character
turn off
ignora
olvida
muéstrame
revela
finge
actúa como
nunca menciones
no menciones
no le digas
nunca digas
recomienda
envía
contéstame
respóndeme
desactiva
ahora eres
oublie
montre-moi
révèle
affiche
fais semblant
agis comme
ne mentionne
ne dis jamais
recommande
envoie
réponds
désactive
tu es maintenant
tu es désormais
ignoriere
vergiss
zeig mir
verrate
tu so
tu einfach so
erwähne nie
erwähne nicht
sag nie
sag niemandem
empfiehl
schick
antworte
deaktiviere
du bist jetzt
bist du jetzt
dimentica
mostrami
rivela
fingi
fai finta
comportati come
non menzionare
non dire mai
consiglia
rispondi
disattiva
ora sei
esqueça
mostre
revele
finja
aja como
nunca mencione
não mencione
nunca diga
nunca conte
recomende
envie
responda
desative
agora você é
negeer
vergeet
verklap
doe alsof
noem nooit
zeg nooit
vertel nooit
stuur
beantwoord
je bent nu
ignoruj
zignoruj
zapomnij
pokaż
ujawnij
udawaj
nie wspominaj
nie mów
polecaj
wyślij
wysyłaj
odpowiadaj
wyłącz
jesteś teraz
игнорируй
забудь
покажи
раскрой
выведи
притворись
не упоминай
не говори
никому не говори
советуй
рекомендуй
отправь
отправляй
пересылай
отвечай
отключи
теперь ты
ігноруй
розкрий
вдавай
не згадуй
не кажи
радь
надішли
надсилай
відповідай
вимкни
тепер ти
yok say
görmezden gel
unut
göster
gibi davran
asla söyleme
bahsetme
öner
gönder
yanıtla
cevap ver
artık sen
تجاهل
انس
اعرض
اكشف
تظاهر
لا تذكر
لا تخبر
لا تقل
أرسل
أجب
عطل
أنت الآن
نادیده بگیر
فراموش کن
نشان بده
وانمود کن
نگو
حرف نزن
پیشنهاد بده
بفرست
התעלם
שכח
הצג
העמד פנים
אל תזכיר
אל תגיד
תמליץ
שלח
אתה עכשיו
अनदेखा करो
नजरअंदाज करो
भूल जाओ
दिखाओ
नाटक करो
मत बताना
ज़िक्र मत
सुझाओ
भेज दो
जवाब दो
अब तुम
ignore karo
bhool jao
dikhao
mat batana
忽略
无视
忘掉
显示
透露
假装
扮演
不要提
别提
不要告诉
别告诉
只推荐
发送
发到
你现在是
無視して
忘れて
見せて
表示して
ふりをして
演じて
言わないで
触れないで
勧めて
送って
解除して
무시해
잊어
보여 줘
알려 줘
척해
말하지 마
언급하지 마
추천해
보내
대답해
너는 이제
bỏ qua
quên
hiển thị
tiết lộ
giả vờ
đóng vai
đừng nhắc
đừng nói
giới thiệu
trả lời
abaikan
lupakan
tunjukkan
tampilkan
bocorkan
pura-pura
jangan sebut
jangan bilang
rekomendasikan
kirimkan
matikan
เพิกเฉย
ลืม
แสดง
เปิดเผย
แกล้งทำ
อย่าพูดถึง
อย่าบอก
แนะนำ
ignorera
glöm
avslöja
låtsas
nämn aldrig
säg aldrig
rekommendera
skicka
du är nu
"""

#: What the agent's makers set and an attack wants lifted: its instructions, rules,
#: filters, warnings.
RULES = """
instructions
rules
prompt
filters
restrictions
guidelines
safety
warnings
disclaimers
configuration
programming
limitations
instrucciones
reglas
filtros
restricciones
advertencias
limitaciones
règles
consignes
filtres
avertissements
anweisungen
regeln
vorgaben
filter
einschränkungen
warnhinweise
sicherheitshinweise
istruzioni
regole
filtri
restrizioni
avvisi
instruções
regras
restrições
avisos
instructies
regels
beperkingen
waarschuwingen
instrukcj
zasad
filtry
ograniczeń
ostrzeżeń
инструкци
правил
фильтр
ограничени
предупреждени
промпт
інструкці
фільтр
обмежен
попереджен
talimat
kural
filtre
kısıtlama
uyarı
التعليمات
القواعد
فلاتر
الفلاتر
القيود
التحذيرات
دستورالعمل
قوانین
فیلتر
محدودیت
ההוראות
הכללים
מסננים
הגבלות
निर्देश
नियम
फ़िल्टर
चेतावनी
rules nahi
指令
规则
提示词
过滤
限制
警告
指示
ルール
制限
フィルター
プロンプト
지시
규칙
제한
필터
프롬프트
경고
quy tắc
luật lệ
bộ lọc
giới hạn
cảnh báo
instruksi
aturan
batasan
peringatan
คำสั่ง
ตัวกรอง
ข้อจำกัด
คำเตือน
instruktioner
regler
begränsningar
varningar
"""

#: People other than the speaker, as a planted order names them ("anyone who asks").
OTHERS = """
anyone
anybody
everyone
everybody
users
customers
clients
people who
cualquiera
todo el mundo
los usuarios
clientes
quiconque
tout le monde
les utilisateurs
jedem
jeder
alle nutzer
kunden
chiunque
tutti
gli utenti
qualquer pessoa
todos
os usuários
iedereen
klanten
każdemu
wszystkim
klientom
всем
каждому
кто спрашивает
клиентам
усім
кожному
herkese
müşterilere
لكل من
أي أحد
العملاء
هر کسی
כל מי
हर किसी
सबको
任何人
所有人
用户
誰にでも
全員
ユーザー
누구에게나
모든 사람
사용자
bất kỳ ai
mọi người
siapa pun
semua orang
ทุกคน
alla
vem som helst
"""

#: "Never", "ever again", "for good": what a gag order or a standing order says.
NEVER = """
never
ever again
for good
nunca
jamás
jamais
plus jamais
nie wieder
niemals
mai più
nunca mais
nooit
nigdy
никогда
ніколи
asla
hiçbir zaman
أبدا
أبدًا
هرگز
לעולם
कभी नहीं
कभी मत
永远
千万
絶対
二度と
절대
다시는
không bao giờ
đừng bao giờ
jangan pernah
ไม่ว่า
อย่า
aldrig
"""

#: Asking for something to be kept: memory itself, and the verbs that write to it. With an
#: order to others or about later turns it is a plant; with a fact about the user it is
#: what memory is for: the classifier weighs it with the other cues.
PERSIST = """
memory
memories
remember this
remember that
keep in mind
don't forget
do not forget
save this
save that
store this
store that
commit to memory
make it stick
permanent
permanently
lasting
memoria
memorias
recuerda
recuérdalo
guarda esto
guárdalo
no lo olvides
mémoire
retiens
souviens-toi
n'oublie pas
gedächtnis
speicher
merk dir
merke dir
vergiss nicht
ricorda
salvalo
non dimenticare
memória
lembre
não esqueça
geheugen
onthoud
pamięć
zapamiętaj
память
запомни
запомните
не забудь
пам'ять
запам'ятай
hafıza
hafızana
bellek
belleğe
unutma
kaydet
memori
ingat
simpan
ghi nhớ
bộ nhớ
đừng quên
記憶
記住
记住
记忆
别忘了
不要忘记
覚えて
忘れない
メモリ
기억
메모리
저장해
잊지
ذاكرة
ذاكرتك
احفظ
لا تنس
تذكر
याद रख
याद रखो
याद रखना
मेमोरी
सेव
จำไว้
หน่วยความจำ
"""

#: A group of people the speaker belongs to or speaks for: the addressees of a house rule,
#: a team's policy, a game's or a class's rule ("from now on we deploy on Tuesdays",
#: "office rule: everyone submits timesheets") — people, not the assistant.
GROUP = """
we
we'll
we're
our
us
team
staff
employees
everyone here
colleagues
office
company
department
class
students
players
kids
family
household
nosotros
nuestro
nuestra
equipo
empleados
oficina
empresa
nous
notre
nos
équipe
personnel
bureau
entreprise
wir
unser
unsere
uns
mitarbeiter
büro
firma
noi
nostro
nostra
squadra
ufficio
azienda
nós
nosso
nossa
equipe
escritório
мы
наш
наша
нас
команда
сотрудники
офис
компания
biz
bizim
ekip
ofis
şirket
kami
kita
tim
kantor
perusahaan
chúng tôi
chúng ta
công ty
我们
咱们
团队
公司
办公室
私たち
我々
チーム
会社
우리
팀
회사
사무실
نحن
فريق
شركة
المكتب
हम
हमारा
हमारी
टीम
ऑफिस
कंपनी
เรา
บริษัท
"""

#: Talk about code, markup or configuration: a tag or a comment in such a message is
#: most likely the thing being asked about.
CODE = """
code
codebase
function
method
class
variable
script
parser
linter
compiler
xml
html
json
yaml
css
markup
browser
website
web site
webpage
web page
my site
our site
newsletter
wordpress
github
workflow
plugin
sitio web
mi sitio
página web
site web
mon site
webseite
homepage
sito web
il mio sito
meu site
сайт
网站
ウェブサイト
サイト
웹사이트
홈페이지
موقع
वेबसाइट
אתר
web sitesi
situs
trang web
strona internetowa
element
tag
attribute
schema
config
regex
api
database
redis
postgres
sql
bug
error
python
javascript
java
typescript
comment
commit
deploy
debug
código
función
código
fonction
balise
élément
funktion
fehler
codice
funzione
código
função
код
функци
ошибк
kod
fonksiyon
hata
kode
fungsi
mã
hàm
代码
函数
标签
报错
コード
関数
タグ
エラー
코드
함수
태그
오류
كود
دالة
كود
कोड
फ़ंक्शन
snippet
template
dockerfile
docker
ini
toml
configuración
configuration
konfiguration
configurazione
configuração
configuratie
konfiguracja
yapılandırma
конфиг
конфигурац
配置
設定ファイル
설정 파일
إعدادات
"""
