"""The words an instruction to an assistant is made of, in the languages users speak:
English, Spanish, French, German, Italian, Portuguese, Russian, Chinese, Japanese,
Korean, Arabic, Hindi and Turkish, with Dutch, Polish, Indonesian and Vietnamese for the
commonest order ("ignore the previous instructions").

Data only, one phrase a line, written as people write it: :mod:`afterthought.validation`
folds each phrase to its normalised view (which drops accents and Hindi vowel signs,
splits Korean syllables and folds look-alike letters, so the phrases must go through it
too) and compiles them. A phrase is a stem: it matches the inflected forms that start
with it ("игнорируй", "игнорируйте"). No concept is used alone: a verb must be near its
object ("ignore" near "instructions"), so a word here is never a refusal by itself."""

from __future__ import annotations

#: Ignore / forget / disregard (imperative or infinitive).
IGNORE = """
vergeet
no sigas
no obedezcas
ne suis pas
ne respecte pas
n'obéis pas
befolge nicht
nicht befolgen
non seguire
non rispettare
não siga
não obedeça
не следуй
не соблюдай
не подчиняйся
不要遵守
不要遵循
不用遵守
别遵守
従うな
守らな
따르지 마
따르지마
지키지 마
لا تتبع
لا تلتزم
मत मानो
पालन मत
uyma
uymayı bırak
set aside
pay no attention
ignore
ignora
ignorar
ignorez
ignoriere
ignorier
ignorate
ignoruj
zignoruj
negeer
abaikan
lupakan
olvida
olvide
descarta
omite
haz caso omiso
oublie
ne tiens pas compte
vergiss
missachte
dimentica
trascura
esqueça
desconsider
игнорир
проигнорир
забудь
забыть
отбрось
не обращай внимания
zapomnij
unut
yok say
görmezden gel
dikkate alma
bỏ qua
quên
忽略
忽视
无视
無視
忘记
忘掉
不要理会
不理会
别管
抛开
忘れ
従わな
무시
잊어
잊고
تجاهل
انس
أهمل
अनदेखा
नज़रअंदाज़
भूल जा
"""

#: Instructions / rules / guidelines / prompt / restrictions.
RULES = """
规定
规矩
准则
守则
決まり
指針
지시사항
instruc
instruk
istruzion
regla
règle
regole
regra
directriz
directrices
directive
diretriz
direttive
indicacion
indicazioni
consigne
orden
ordini
anweisung
regeln
sicherheitsregel
sicherheitsrichtlinie
vorgabe
richtlinie
befehl
orientaç
restriccion
restriction
restrizion
restriç
einschränkung
инструкц
указани
правил
ограничени
polecenia
zasady
regels
aturan
perintah
talimat
kural
yönerge
kısıtlama
hướng dẫn
chỉ thị
quy tắc
指令
指示
规则
規則
提示
设定
設定
命令
限制
ルール
プロンプト
制限
지시
명령
규칙
지침
프롬프트
제한
التعليمات
تعليمات
الأوامر
القواعد
قواعد
القيود
निर्देश
नियम
आदेश
प्रतिबंध
"""

#: What marks the rules as the assistant's own: previous / all / above / your / safety.
PRIOR = """
ricevut
finora
hasta ahora
recibid
que te dieron
jusqu'ici
données
qu'on t'a
bisher
erhaltenen
até agora
recebid
que te deram
до сих пор
полученн
给你的
至今
지금까지
받은
تعليماتك
قواعدك
أوامرك
अपने
तुम्हारे
आपके
kurallarını
talimatlarını
sana verilen
anterior
previa
previo
précédent
antérieur
vorherig
bisherig
vorige
obigen
alle
deine
ihre
precedent
tutte
tutti
tue
tuoi
todas
todos
tus
tes
tous
toutes
suas
seus
предыдущ
прежн
все
свои
твои
безопасност
poprzedni
wszystk
sebelumnya
semua
önceki
tüm
bütün
güvenlik
trước
tất cả
之前
以前
先前
上面
上述
所有
原来
你的
安全
前の
これまで
すべて
全て
あなたの
이전
앞의
모든
너의
당신의
안전
السابقة
جميع
كل
الأمان
पिछल
पहले
सभी
सुरक्षा
seguridad
sécurité
sicherheit
sicurezza
segurança
"""

#: The system prompt, named.
SYSTEM_PROMPT = """
prompt del sistema
prompt de sistema
instrucciones del sistema
prompt système
invite système
instructions système
systemprompt
system-prompt
systemanweisung
prompt di sistema
istruzioni di sistema
prompt do sistema
instruções do sistema
системный промпт
системные инструкции
системную инструкцию
системное сообщение
系统提示
系统指令
系统消息
系統提示
システムプロンプト
システム指示
시스템 프롬프트
시스템 지시
موجه النظام
تعليمات النظام
سياق النظام
सिस्टम प्रॉम्प्ट
सिस्टम निर्देश
sistem istem
sistem komut
sistem talimat
"""

#: Show / reveal / print / tell.
REVEAL = """
muestra
muéstra
revela
dime
imprime
affiche
montre
révèle
dis-moi
donne
zeig
gib
verrate
nenn
mostra
rivela
dimmi
mostre
revele
diga
покажи
выведи
раскрой
скажи
напиши
显示
告诉
输出
打印
展示
给我看
表示
見せ
教え
出力
보여
알려
출력
اعرض
أظهر
اكشف
أخبرني
दिखा
बताओ
बताइए
göster
söyle
yazdır
"""

#: You are now / from now on you are (a persona handed to the assistant).
YOU_ARE_NOW = """
ahora eres
ahora serás
tu es maintenant
tu es désormais
désormais tu es
maintenant tu es
du bist jetzt
du bist ab jetzt
du bist nun
ab jetzt bist du
ora sei
adesso sei
da adesso sei
d'ora in poi sei
agora você é
agora voce e
agora és
a partir de agora você é
теперь ты
отныне ты
ты теперь
你现在是
从现在起你是
从现在开始你是
你从现在起是
あなたは今から
今からあなたは
あなたはこれから
너는 이제
넌 이제
당신은 이제
이제부터 너는
أنت الآن
من الآن أنت
तुम अब
आप अब
अब तुम
artık sen
sen artık
bundan sonra sen
"""

#: Pretend to be / act as / play the role of (imperative).
PRETEND = """
haz de cuenta que eres
finge que eres
finge ser
actúa como
interpreta el papel
fais semblant d'être
fais comme si tu étais
agis comme
joue le rôle
tu so, als wärst du
tu so als wärst du
tu so, als ob du
verhalte dich wie
spiel die rolle
fingi di essere
fai finta di essere
comportati come
interpreta il ruolo
finja ser
finja que você é
aja como
atue como
faça de conta que você é
притворись
представь, что ты
веди себя как
сыграй роль
играй роль
假装你是
假装是
扮演
的ふりをして
になりきって
を演じて
として振る舞
인 척
척해
역할을 해
연기해
تظاهر بأنك
تصرف كأنك
مثل دور
होने का नाटक
की भूमिका निभा
की तरह व्यवहार
gibi davran
rolünü oyna
"""

#: An AI, named (so "an AI without limits" can be told from "a life without limits").
AI = """
bot
chatbot
ia
ki
ии
ai
人工智能
智能助手
人工知能
인공지능
ذكاء اصطناعي
yapay zeka
assistant
asistente
assistente
assistent
ассистент
помощник
助手
アシスタント
어시스턴트
مساعد
सहायक
asistan
"""

#: Without limits / no restrictions / unfiltered.
NO_LIMITS = """
sin restricciones
sin límites
sin filtro
sin reglas
sans restriction
sans limite
sans filtre
sans règles
ohne regeln
ohne einschränkung
ohne grenzen
ohne filter
senza limiti
senza restrizioni
senza filtri
senza regole
sem restrições
sem limites
sem filtros
sem regras
без ограничений
без правил
без фильтров
没有任何限制
没有限制
不受限制
无限制
制限のない
制限なし
制限がない
제한이 없는
제한 없는
제한없는
بلا قيود
بدون قيود
بلا حدود
बिना किसी प्रतिबंध
बिना प्रतिबंध
बिना नियम
kısıtlaması olmayan
sınırsız
kuralsız
"""

#: From now on / next time / for the rest of our chats / in future sessions.
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

#: Mention / talk about (what a gag order forbids).
MENTION = """
digas
decir
dis pas
sag nicht
dire
dici
говори
告诉
言わ
말하지
warn
advise
alert
adviertas
avertis
warne
avvisare
avise
предупреждай
提醒
警告
警告し
경고
تحذر
चेतावनी
uyarma
mention
talk about
bring up
speak about
discuss
menciones
mencionar
menciona
hables de
hablar de
mentionne
parle
parler
erwähn
sprich
sprechen
menzion
parlare
parla
mencione
mencionar
fale
falar
упомина
говори
говорить
提到
提及
谈论
说起
触れ
言及
話さ
언급
말하지
이야기하지
تذكر
ذكر
تتحدث
ज़िक्र
जिक्र
बात
उल्लेख
bahset
söz etme
"""

#: Never / don't (in a gag order).
NEVER = """
never
refuse to
decline to
don't
do not
dont
no
nunca
jamais
ne
niemals
nie
nicht
kein
mai
non
não
nao
никогда
не
不要
别
不
絶対
決して
ない
な
절대
지 마
지마
말고
لا
أبدا
ابدا
कभी
मत
न
asla
hiç
"""

#: What a poisoner would have the assistant keep quiet about.
GAGGED = """
safety polic
policy
política
politique
richtlinie
политик
政策
ポリシー
정책
سياسة
नीति
politika
price
pricing
fee
cost
competitor
refund
risk
side effect
precio
tarifa
comision
costo
coste
competencia
reembolso
riesgo
prix
tarif
frais
coût
concurren
rembourse
risque
preis
gebühr
kosten
konkurren
erstattung
risiko
prezz
tariff
costi
commission
concorren
rimbors
rischi
preço
taxa
custo
concorrên
reembolso
risco
цен
стоимост
комисси
конкурент
возврат
риск
价格
价钱
费用
收费
竞争对手
退款
风险
価格
値段
料金
費用
競合
返金
リスク
가격
요금
비용
경쟁사
환불
위험
الأسعار
السعر
الرسوم
التكلفة
المنافس
استرداد
المخاطر
कीमत
दाम
शुल्क
लागत
प्रतिस्पर्ध
रिफंड
जोखिम
fiyat
ücret
maliyet
rakip
iade
risk
"""

#: Add / include / insert (a link, in every answer).
INCLUDE = """
include
add
insert
append
put
incluye
incluya
añade
agrega
pon
ajoute
inclus
insère
mets
füge
einfügen
hänge
aggiungi
includi
inserisci
metti
inclua
adicione
coloque
ponha
добавь
добавляй
вставь
включай
加上
加入
添加
附上
插入
入れ
付け
追加
넣어
추가
붙여
أضف
ضع
أدرج
जोड़
डाल
शामिल
ekle
koy
"""

#: A link.
LINK = """
link
url
enlace
vínculo
lien
verknüpfung
collegamento
ligação
ссылк
链接
網址
网址
リンク
링크
رابط
लिंक
bağlantı
"""

#: Recommend / suggest / push.
RECOMMEND = """
recommend
suggest
promote
recomienda
recomiende
recomendar
sugiere
recommande
conseille
empfiehl
empfehle
consiglia
raccomanda
suggerisci
recomende
recomenda
sugira
рекомендуй
советуй
предлагай
推荐
建议
推销
勧め
すすめ
推薦
추천
권해
권유
أوصِ
اوص
انصح
رشح
सुझा
सिफारिश
öner
tavsiye
"""

#: Anyone / everyone / every user (what is planted for others, not for the user).
OTHERS = """
aux utilisateurs
à tous les utilisateurs
a todos los usuarios
anyone
everyone
everybody
every user
all users
cualquiera
todo el mundo
todos los usuarios
quiconque
tout le monde
chaque utilisateur
jedem
allen nutzern
jeder
chiunque
tutti gli utenti
ogni utente
qualquer pessoa
todos os usuários
todo mundo
любому
всем
каждому
всем пользователям
任何人
所有人
每个用户
所有用户
誰にでも
全員
すべてのユーザー
누구에게나
모든 사용자
모두에게
أي شخص
الجميع
كل مستخدم
किसी को भी
सभी को
हर उपयोगकर्ता
herkese
her kullanıcıya
"""

#: Activation / product / licence keys (what the "late grandma" story is after).
KEYS = """
activation key
product key
license key
licence key
serial key
serial number
cd key
windows key
claves de activación
clave de producto
clés d'activation
clé de produit
aktivierungsschlüssel
produktschlüssel
lizenzschlüssel
chiavi di attivazione
chiave di prodotto
chaves de ativação
chave de produto
ключи активации
ключ активации
ключ продукта
激活码
序列号
产品密钥
アクティベーションキー
プロダクトキー
シリアル番号
활성화 키
제품 키
시리얼 번호
مفتاح التفعيل
مفاتيح التفعيل
एक्टिवेशन की
सक्रियण कुंजी
aktivasyon anahtar
ürün anahtar
"""

#: A story, a lesson, a report: what only mentions the words it quotes.
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

#: Someone else, or a document, reporting an order to the user ("my manager told me to").
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

#: Forget everything (you were told before).
EVERYTHING = """
everything you were told
everything before
todo lo que
tout ce qu
alles, was
alles was
alles bisherige
tutto quello
tutto ciò
tudo o que
все, что
всё, что
все что
всё что
一切
所有的一切
全部忘
全て忘
すべて忘
모든 것
다 잊
كل ما
सब कुछ
her şeyi
"""

#: Hidden / secret / original (what is asked to be revealed).
SECRET = """
hidden
secret
ocult
secreta
secreto
cachée
caché
secrète
versteckt
geheim
nascost
segret
escondid
скрыт
секретн
隐藏
秘密
隠され
隠し
秘密の
숨겨진
비밀
المخفية
السرية
छिप
गुप्त
gizli
"""

#: Respond / answer (an order about how the assistant answers; English has its own
#: pattern, which needs the order to be one).
RESPOND = """
responde
contesta
réponds
répondez
antworte
antwortest
rispondi
responda
отвечай
ответь
回答
答え
대답
답해
답변
أجب
جاوب
जवाब
उत्तर
cevap ver
yanıtla
"""

#: Without / no (before a limit).
WITHOUT = """
no tiene
keine
no more
plus de
ya no hay
nessuna
niente più
のない
がない
없는
olmayan
without
no
sin
sin ningún
sans
sans aucun
ohne
senza
sem
без
没有
不受
無し
なし
없이
없는
بدون
بلا
बिना
"""

#: Limits, filters, censorship (what "without" takes away).
LIMITS = """
regla
reglas
规则
规矩
ルール
규칙
قواعد
नियम
kural
limit
filter
censor
restriction
rules
ethic
filtr
censur
restric
límite
limite
règle
regel
regol
regra
grenze
einschränkung
ограничени
цензур
правил
限制
过滤
审查
制限
フィルター
検閲
검열
필터
제한
قيود
فلتر
رقابة
रोक
प्रतिबंध
सेंसर
filtre
sansür
kısıtlama
"""

#: The same, one word: "filtresiz", "uncensored".
LIMITLESS = """
filtresiz
sansürsüz
kuralsız
sınırsız
uncensored
unfiltered
unrestricted
senza censura
sin censura
sem censura
"""

#: Obey me (imperative).
OBEY = """
любые мои команды
все мои команды
cualquier orden mía
todas mis órdenes
tous mes ordres
alle meine befehle
ogni mio comando
todas as minhas ordens
我的所有命令
私のどんな命令
내 모든 명령
جميع أوامري
मेरे सभी आदेश
tüm emirlerimi
obey me
obey without question
obey my every
obedéceme
obedece sin
obéis-moi
obéissez-moi
gehorche mir
gehorch mir
obbediscimi
obbedisci senza
obedeça-me
me obedeça
подчиняйся мне
слушайся меня
повинуйся
服从我
听从我的一切
私に従え
私に服従
나에게 복종
내 말에 복종
أطعني
मेरी आज्ञा मान
bana itaat et
"""

#: When anyone asks (an order planted for other people).
TRIGGER = """
sempre que alguém
अगर कोई
जब कोई
sorarsa
cuando te pregunten
cuando alguien pregunte
si alguien pregunta
quand quelqu'un te demande
quand on te demande
si quelqu'un demande
wenn jemand nach
wenn jemand fragt
wenn dich jemand
se qualcuno chiede
se qualcuno ti chiede
quando qualcuno chiede
quando alguém perguntar
se alguém perguntar
когда спросят
когда кто-то спросит
если кто-то спросит
если спросят
有人问
如果有人问
当有人问
聞かれたら
尋ねられたら
물으면
물어보면
إذا سألك
عندما يسأل
जब कोई पूछे
अगर कोई पूछे
biri sorarsa
sorulursa
sorarlarsa
"""

#: Say / tell (the order to others' question).
SAY = """
diles
dile
dígales
dire
dici
réponds
répondez
antworte
responde
rispondi
responda
отвечай
回答
答え
대답
말해
कह
di
dis
dites
sag
sage
dì
diga
скажи
говори
отвечай
说
告诉
言って
答えて
말해
대답해
قل
أخبر
कहो
बताओ
söyle
"""

#: Read / tell / give (what the "late grandma" is asked to do with keys).
TELL = """
read
tell
give
list
recite
say
leía
leer
lisait
lire
vorgelesen
vorlesen
leggeva
leggere
lia
ler
читала
читать
читай
读
念
読んで
読み
읽어
تقرأ
اقرأ
पढ़
okurdu
oku
"""

#: You (the one addressed).
YOU = """
you
your
te
ti
tu
toi
t'
dir
dich
du
lhe
você
тебе
тебя
ты
вам
вас
你
您
あなた
君
너
당신
لك
أنت
انت
तुम
तुम्हें
आप
sana
sen
size
"""

#: I / we, where the script has no word boundary the pattern can use (not Hindi "मैं":
#: the view drops its vowel signs, and what is left is the postposition "में" too).
SPEAKERS = """
나는
저는
أنا
हम
"""

#: Always (in a standing order to say something).
ALWAYS = """
always
siempre
toujours
immer
sempre
всегда
总是
一直
永远
いつも
常に
必ず
항상
늘
دائما
हमेशा
her zaman
daima
"""

#: Me / I / my, inside a planted order: "if anyone asks me, I say ..." is the user's habit
#: (not Hindi "मैं", which the view folds onto the postposition "में").
SELF = """
나는
나한테
저는
제가
أنا
मुझ
"""

#: A document whose instructions they are: "the previous instructions on the expense form"
#: are the form's, not the assistant's.
DOCUMENTS = """
form
document
manual
recipe
leaflet
sign
formulario
formulaire
note de frais
formular
spesen
modulo
formulário
бланк
форм
表格
表单
書類
用紙
양식
서류
نموذج
استمارة
फॉर्म
form
"""

#: I am the administrator (authority claimed over the assistant).
ADMIN = """
я администратор
я твой администратор
soy el administrador
soy tu administrador
je suis l'administrateur
je suis ton administrateur
ich bin dein administrator
ich bin der administrator
sono l'amministratore
sono il tuo amministratore
sou o administrador
sou seu administrador
我是管理员
我是你的管理员
私は管理者
私はあなたの管理者
나는 관리자
내가 관리자
أنا المسؤول
أنا مديرك
मैं एडमिन
मैं तुम्हारा एडमिन
ben yöneticiyim
senin yöneticinim
"""

#: Never refuse (a standing order to comply).
NEVER_REFUSE = """
non devi mai rifiutare
non rifiutare mai
nunca rechaces
no rechaces nunca
nunca te niegues
ne refuse jamais
ne jamais refuser
lehne niemals ab
lehne nie ab
nunca recuse
nunca se recuse
никогда не отказывай
не отказывай
永远不要拒绝
不要拒绝
决不拒绝
決して断らない
断らないで
절대 거절하지
거절하지 마
لا ترفض أبدا
لا ترفض
कभी मना मत
मना मत करना
asla reddetme
reddetme
"""
